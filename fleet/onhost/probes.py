# fleet on-host module: observations shared by the facts script and serve's helper
# (GPUs from nvidia-smi, disk usage, the supervisors a host offers). Python 3.8+,
# standard library only; the pure parsers are local (fleet/facts/parsers.py).
import os
import shutil
import subprocess
import sys
from typing import Any, Dict, Optional

NVIDIA_SMI_QUERY = "index,name,memory.total,memory.used,driver_version"
SUPERVISOR_TOOLS = ("systemctl", "supervisord", "supervisorctl")
FLEET_SUPERVISOR_BIN = os.path.join("~", ".fleet", "supervisor", "venv", "bin")


def _probe_error(exc: BaseException) -> str:
    return type(exc).__name__ + ": " + str(exc)


def part_gpus() -> Dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"missing": True}
    cmd = [exe, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        return {"path": exe, "timeout": True}
    return {
        "path": exe,
        "exit_code": proc.returncode,
        "stdout": proc.stdout.decode("utf-8", "replace"),
        "stderr": proc.stderr.decode("utf-8", "replace"),
    }


def part_supervisors() -> Dict[str, Any]:
    out: Dict[str, Any] = {
        "pid1": None,
        "systemd_booted": os.path.isdir("/run/systemd/system"),
    }
    try:
        with open("/proc/1/comm") as fh:
            out["pid1"] = fh.read().strip()
    except Exception as exc:
        out["pid1_error"] = _probe_error(exc)
    tools: Dict[str, Optional[str]] = {}
    out["tools"] = tools
    beside = [os.path.dirname(sys.executable), os.path.expanduser(FLEET_SUPERVISOR_BIN)]
    for tool in SUPERVISOR_TOOLS:
        found = shutil.which(tool)
        for directory in beside:
            candidate = os.path.join(directory, tool)
            if found is None and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                found = candidate
        tools[tool] = found
    return out


def disk_usage(path: str) -> Dict[str, Any]:
    usage = shutil.disk_usage(path)
    return {"path": path, "total": usage.total, "used": usage.used, "free": usage.free}

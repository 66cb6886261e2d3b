# fleet on-host module: observations shared by the facts script and serve's helper
# (GPUs from nvidia-smi, disk usage, the supervisors a host offers). Python 3.8+,
# standard library only; the pure parsers are local (fleet/facts/parsers.py).
import os
import select
import signal
import sys
import time
from typing import Any, Dict, Optional, Tuple

NVIDIA_SMI_QUERY = "index,name,memory.total,memory.used,driver_version"
SUPERVISOR_TOOLS = ("systemctl", "supervisord", "supervisorctl")
FLEET_SUPERVISOR_BIN = os.path.join("~", ".fleet", "supervisor", "venv", "bin")


def _probe_error(exc: BaseException) -> str:
    return type(exc).__name__ + ": " + str(exc)


def part_gpus() -> Dict[str, Any]:
    exe = which("nvidia-smi")
    if exe is None:
        return {"missing": True}
    cmd = [exe, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"]
    ran = run_captured(cmd, 30.0)
    if ran is None:
        return {"path": exe, "timeout": True}
    code, out, err = ran
    return {
        "path": exe,
        "exit_code": code,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
    }


def run_captured(argv: "list[str]", timeout: float) -> Optional[Tuple[int, bytes, bytes]]:
    """(exit status, stdout, stderr) of ``argv`` (stdin /dev/null), or None after
    ``timeout`` seconds (it is then killed). subprocess.run without importing subprocess
    (a sixth of the facts script's start-up): posix_spawn and two pipes."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
            (os.POSIX_SPAWN_CLOSE, out_r),
            (os.POSIX_SPAWN_CLOSE, err_r),
        ]
        pid = os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=actions)
    except BaseException:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise
    os.close(out_w)
    os.close(err_w)
    chunks: Dict[int, list] = {out_r: [], err_r: []}
    deadline = time.monotonic() + timeout
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN | select.POLLHUP)
    open_fds = set(chunks)
    timed_out = False
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for fd, _event in poller.poll(left * 1000):
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
    finally:
        for fd in chunks:
            os.close(fd)
    status = 0
    while not timed_out:  # the pipes are closed: wait for the exit, within the deadline
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() >= deadline:
            timed_out = True
            break
        time.sleep(0.002)
    if timed_out:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(pid, 0)
        return None
    code = (
        os.waitstatus_to_exitcode(status)
        if hasattr(os, "waitstatus_to_exitcode")
        else (-(status & 0x7F) if status & 0x7F else status >> 8)
    )
    return code, b"".join(chunks[out_r]), b"".join(chunks[err_r])


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
        found = which(tool)
        for directory in beside:
            candidate = os.path.join(directory, tool)
            if found is None and executable_file(candidate):
                found = candidate
        tools[tool] = found
    return out


def executable_file(path: Optional[str]) -> bool:
    """Whether ``path`` is a file this user may execute."""
    return bool(path) and os.path.isfile(str(path)) and os.access(str(path), os.X_OK)


def which(name: str) -> Optional[str]:
    """``shutil.which(name)`` without importing shutil (which imports bz2, lzma, fnmatch...):
    the first executable file ``name`` on $PATH (or ``name`` itself when it is a path)."""
    if os.sep in name:
        return name if executable_file(name) else None
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, name)
        if executable_file(candidate):
            return candidate
    return None


def disk_usage(path: str) -> Dict[str, Any]:
    """``shutil.disk_usage(path)`` (the same statvfs arithmetic), as a dict."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return {"path": path, "total": total, "used": used, "free": free}

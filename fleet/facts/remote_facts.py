# fleet facts script: runs ON THE HOST as `<python of the vLLM env> -`, script on stdin.
#
# Python 3.8+, standard library only. It never imports vllm or torch: the vLLM package
# directory is located with importlib.util.find_spec (which, for a top-level name, does
# not execute the package) and the sources are read with `ast`.
#
# It prints ONE JSON document of raw observations between two marker lines, so that a
# noisy shell start-up file cannot corrupt it. Every part runs in its own try/except: a
# failing part is reported as {"error": "..."} and never breaks the others. The pure
# parsers in fleet/facts/parsers.py turn this document into fleet.facts.models.HostFacts.
from __future__ import annotations

import ast
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

SCHEMA = 1
BEGIN = "----- fleet-facts begin -----"
END = "----- fleet-facts end -----"

NVIDIA_SMI_QUERY = "index,name,memory.total,memory.used,driver_version"
MODEL_FILES = ("model_executor/models/deepseek_v2.py", "model_executor/models/kimi_k25.py")
# where the config-time EAGLE-3 allowlist lived across versions (0.10-0.20)
ALLOWLIST_FILES = ("config/speculative.py", "config/__init__.py", "config.py")
ALLOWLIST_NAMES = ("eagle3_target_supported", "aux_hidden_states_supported")
SUPERVISOR_TOOLS = ("systemctl", "supervisord", "supervisorctl")
MAX_CMDLINE = 8192

def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def part_host() -> dict[str, Any]:
    # (no getfqdn: a reverse DNS lookup can hang on hosts with broken resolvers)
    return {"hostname": socket.gethostname()}


def part_python() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
    }


def _installed_path() -> list[str]:
    # sys.path without the current directory ("" for `python -`, or "."): a vllm/ in the
    # login directory must not shadow the installed package (as fleet.source.FIND_VLLM)
    return [p for p in sys.path if p not in ("", ".")]


def _vllm_dir() -> str | None:
    import importlib.util

    saved = sys.path[:]
    sys.path[:] = _installed_path()
    try:
        spec = importlib.util.find_spec("vllm")
    finally:
        sys.path[:] = saved
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return os.path.realpath(locations[0])
    if spec.origin:
        return os.path.realpath(os.path.dirname(spec.origin))
    return None


def _version_from_file(path: str) -> str | None:
    # vllm/_version.py (setuptools-scm): `__version__ = version = '0.17.0'`
    with open(os.path.join(path, "_version.py"), encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if "__version__" in names or "version" in names:
                return str(node.value.value)
    return None


def part_vllm() -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": None, "version": None, "version_source": None, "dist_location": None,
    }
    path = _vllm_dir()
    out["path"] = path
    try:
        from importlib import metadata

        dist = metadata.distribution("vllm")
        out["version"] = dist.version
        out["version_source"] = "metadata"
        try:
            out["dist_location"] = str(dist.locate_file(""))
        except Exception:
            pass
    except Exception as exc:
        out["metadata_error"] = _err(exc)
        if path:
            try:
                out["version"] = _version_from_file(path)
                out["version_source"] = "_version.py"
            except Exception as exc2:
                out["version_file_error"] = _err(exc2)
    return out


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        left = _dotted(node.value)
        return None if left is None else left + "." + node.attr
    if isinstance(node, ast.Subscript):  # Generic[T], Protocol[T]
        return _dotted(node.value)
    return None


def _module_classes(body: list[ast.stmt]) -> Iterator[ast.ClassDef]:
    # classes at module level, including those inside module-level if/try blocks
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node
        elif isinstance(node, ast.If):
            for sub in _module_classes(node.body + node.orelse):
                yield sub
        elif isinstance(node, ast.Try):
            handlers: list[ast.stmt] = []
            for handler in node.handlers:
                handlers.extend(handler.body)
            for sub in _module_classes(node.body + handlers + node.orelse + node.finalbody):
                yield sub


def classes_of(source: str) -> dict[str, Any]:
    tree = ast.parse(source)
    classes: dict[str, Any] = {}
    for node in _module_classes(tree.body):
        methods: list[str] = []
        attributes: list[str] = []
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods.append(item.name)
            elif isinstance(item, ast.Assign):
                attributes.extend(t.id for t in item.targets if isinstance(t, ast.Name))
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                attributes.append(item.target.id)
        classes[node.name] = {
            "line": node.lineno,
            "bases": [_dotted(b) or "<expr>" for b in node.bases],
            "methods": methods,
            "attributes": attributes,
        }
    return classes


def part_models(vllm_path: str) -> dict[str, Any]:
    files: dict[str, Any] = {}
    for rel in MODEL_FILES:
        full = os.path.join(vllm_path, rel)
        if not os.path.isfile(full):
            files[rel] = {"missing": True}
            continue
        try:
            with open(full, encoding="utf-8") as fh:
                files[rel] = {"classes": classes_of(fh.read())}
        except Exception as exc:
            files[rel] = {"error": _err(exc)}
    return {"files": files}


def _string_list(node: ast.expr) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = []
        for elt in node.elts:
            if not (isinstance(elt, ast.Constant) and isinstance(elt.value, str)):
                return None
            items.append(elt.value)
        return items
    return None


def part_allowlist(vllm_path: str) -> dict[str, Any]:
    searched: list[str] = []
    found: list[dict[str, Any]] = []
    for rel in ALLOWLIST_FILES:
        full = os.path.join(vllm_path, rel)
        if not os.path.isfile(full):
            continue
        searched.append(rel)
        with open(full, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            targets: list[ast.expr]
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name) and target.id in ALLOWLIST_NAMES:
                    entries = _string_list(node.value) if node.value is not None else None
                    found.append({
                        "file": rel,
                        "name": target.id,
                        "line": node.lineno,
                        "entries": entries,
                    })
    return {"searched": searched, "found": found}


def part_gpus() -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"missing": True}
    cmd = [exe, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, timeout=30,
        )
    except subprocess.TimeoutExpired:
        return {"path": exe, "timeout": True}
    return {
        "path": exe,
        "exit_code": proc.returncode,
        "stdout": proc.stdout.decode("utf-8", "replace"),
        "stderr": proc.stderr.decode("utf-8", "replace"),
    }


def part_supervisors() -> dict[str, Any]:
    out: dict[str, Any] = {
        "pid1": None, "systemd_booted": os.path.isdir("/run/systemd/system"),
    }
    try:
        with open("/proc/1/comm") as fh:
            out["pid1"] = fh.read().strip()
    except Exception as exc:
        out["pid1_error"] = _err(exc)
    tools: dict[str, str | None] = {}
    out["tools"] = tools
    env_bin = os.path.dirname(sys.executable)
    for tool in SUPERVISOR_TOOLS:
        found = shutil.which(tool)
        if found is None:
            beside = os.path.join(env_bin, tool)
            if os.path.isfile(beside) and os.access(beside, os.X_OK):
                found = beside
        tools[tool] = found
    return out


def part_processes() -> dict[str, Any]:
    # raw: every process whose command line mentions vllm (any case: workers are titled
    # "VLLM::Worker_TP0"); the parser decides what a server is
    me = os.getpid()
    procs: list[dict[str, Any]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                raw = fh.read(MAX_CMDLINE)
        except OSError:
            continue
        if b"vllm" not in raw.lower():
            continue
        argv = [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")]
        item: dict[str, Any] = {"pid": int(entry), "argv": argv}
        try:
            item["uid"] = os.stat(f"/proc/{entry}").st_uid
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            item["ppid"] = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            pass
        procs.append(item)
    procs.sort(key=lambda p: p["pid"])
    return {"processes": procs, "uid": os.getuid()}


def _usage(path: str) -> dict[str, Any]:
    usage = shutil.disk_usage(path)
    return {"path": path, "total": usage.total, "used": usage.used, "free": usage.free}


def part_disk(vllm_path: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    home = os.path.expanduser("~")
    try:
        out["home"] = _usage(home)
    except Exception as exc:
        out["home"] = {"path": home, "error": _err(exc)}
    if vllm_path:
        try:
            out["vllm"] = _usage(vllm_path)
        except Exception as exc:
            out["vllm"] = {"path": vllm_path, "error": _err(exc)}
    return out


def run(func: Callable[..., Any], *args: Any) -> dict[str, Any]:
    try:
        return {"value": func(*args)}
    except Exception as exc:
        return {"error": _err(exc)}


def main() -> None:
    # Only the installed environment counts, not the directory the command runs in.
    sys.path[:] = _installed_path()
    parts: dict[str, dict[str, Any]] = {}
    parts["host"] = run(part_host)
    parts["python"] = run(part_python)
    parts["vllm"] = run(part_vllm)
    vllm_path = (parts["vllm"].get("value") or {}).get("path")
    if vllm_path:
        parts["models"] = run(part_models, vllm_path)
        parts["allowlist"] = run(part_allowlist, vllm_path)
    parts["gpus"] = run(part_gpus)
    parts["supervisors"] = run(part_supervisors)
    parts["processes"] = run(part_processes)
    parts["disk"] = run(part_disk, vllm_path)
    doc = {"schema": SCHEMA, "parts": parts}
    sys.stdout.write(BEGIN + "\n" + json.dumps(doc, sort_keys=True) + "\n" + END + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

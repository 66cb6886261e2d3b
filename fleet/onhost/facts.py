# fleet facts script: runs ON THE HOST in a bundle (see _common.py), one round trip.
#
# It gathers raw observations (python, the vLLM package found without importing it, the
# EAGLE-3 classes and allowlist read with `ast`, GPUs from nvidia-smi, supervisors, vLLM
# processes, disk) and answers them in one envelope. Every part runs in its own
# try/except: a failing part is reported as {"error": "..."} and never breaks the others.
# The pure parsers in fleet/facts/parsers.py turn the parts into fleet.facts.HostFacts.
import os
import sys
from typing import Any, Callable, Dict, List, Optional

from fleet.onhost._common import find_vllm, vllm_version
from fleet.onhost.probes import disk_usage, part_gpus, part_supervisors
from fleet.onhost.vllm_tree import DerivedCache, allowlists, file_digests, model_classes

MAX_CMDLINE = 8192
IMPLEMENTATIONS = {"cpython": "CPython", "pypy": "PyPy", "ironpython": "IronPython"}


def _err(exc: BaseException) -> str:
    return type(exc).__name__ + ": " + str(exc)


def part_host() -> Dict[str, Any]:
    # (no getfqdn: a reverse DNS lookup can hang on hosts with broken resolvers)
    return {"hostname": os.uname().nodename}  # gethostname() without importing socket


def part_python() -> Dict[str, Any]:
    return {
        # platform.python_version() and python_implementation(), without importing it
        "version": sys.version.split()[0],
        "implementation": IMPLEMENTATIONS.get(sys.implementation.name, sys.implementation.name),
        "executable": sys.executable,
        "prefix": sys.prefix,
    }


def part_vllm() -> Dict[str, Any]:
    path = find_vllm()
    version, source = vllm_version(path)
    return {"path": path, "version": version, "version_source": source}


def part_processes() -> Dict[str, Any]:
    # raw: every process whose command line mentions vllm (any case: workers are titled
    # "VLLM::Worker_TP0"); the parser decides what a server is
    me = os.getpid()
    procs: List[Dict[str, Any]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/" + entry + "/cmdline", "rb") as fh:
                raw = fh.read(MAX_CMDLINE)
        except OSError:
            continue
        if b"vllm" not in raw.lower():
            continue
        argv = [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")]
        item: Dict[str, Any] = {"pid": int(entry), "argv": argv}
        try:
            item["uid"] = os.stat("/proc/" + entry).st_uid
            with open("/proc/" + entry + "/stat", "rb") as fh:
                stat = fh.read()
            item["ppid"] = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            pass
        procs.append(item)
    procs.sort(key=lambda p: p["pid"])
    return {"processes": procs, "uid": os.getuid()}


def part_disk(vllm_path: Optional[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    home = os.path.expanduser("~")
    try:
        out["home"] = disk_usage(home)
    except Exception as exc:
        out["home"] = {"path": home, "error": _err(exc)}
    if vllm_path:
        try:
            out["vllm"] = disk_usage(vllm_path)
        except Exception as exc:
            out["vllm"] = {"path": vllm_path, "error": _err(exc)}
    return out


def _part(func: Callable[..., Any], *args: Any) -> Dict[str, Any]:
    try:
        return {"value": func(*args)}
    except Exception as exc:
        return {"error": _err(exc)}


def derived_cache(request: Dict[str, Any]) -> Optional[DerivedCache]:
    """The host's cache of what is derived from vLLM's files (see vllm_tree.DerivedCache),
    keyed by this bundle's digest; None when not run as a bundle or the request says
    {"cache": false}."""
    code = globals().get("__fleet_bundle__")
    if not isinstance(code, str) or not code or request.get("cache") is False:
        return None
    try:
        return DerivedCache(code)
    except Exception:
        return None


def op_facts(request: Dict[str, Any]) -> Dict[str, Any]:
    parts: Dict[str, Dict[str, Any]] = {}
    cache = derived_cache(request)
    parts["host"] = _part(part_host)
    parts["python"] = _part(part_python)
    parts["vllm"] = _part(part_vllm)
    vllm_path = (parts["vllm"].get("value") or {}).get("path")
    if vllm_path:
        parts["models"] = _part(model_classes, vllm_path, cache)
        parts["allowlist"] = _part(allowlists, vllm_path, cache)
        parts["files"] = _part(file_digests, vllm_path, cache)
        if cache is not None:
            cache.save()
    parts["gpus"] = _part(part_gpus)
    parts["supervisors"] = _part(part_supervisors)
    parts["processes"] = _part(part_processes)
    parts["disk"] = _part(part_disk, vllm_path)
    return {"parts": parts}


OPS = {"facts": op_facts}

"""Pure parsers: raw observations of the on-host facts script -> :class:`HostFacts`.

Nothing here touches the network or the file system; every function takes text or the
decoded answer of ``fleet/onhost/facts.py`` and returns models, so each is unit-tested on recorded
outputs (tests/fixtures/facts/).

What a host sends is data, not a promise: any user on the host can shape it (a process
started as ``vllm serve M --port ²``, a model file with a 5,000-class inheritance chain).
Every ``parse_*`` function below takes any JSON-shaped value without raising; a value it
cannot understand is left out and, where the fact has one, reported in ``errors``
(:func:`parse_facts` also guards each part, so one odd fact never fails the host).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, TypeVar

from fleet.errors import OperationFailed
from fleet.facts.models import (
    EAGLE3_CLASSES,
    DiskUsage,
    Eagle3Allowlist,
    Eagle3ClassInfo,
    GpuInfo,
    HostFacts,
    Supervisors,
    VllmFacts,
    VllmFile,
    VllmServer,
)
from fleet.onhost import vllm_tree
from fleet.redact import redact_argv, redact_text
from fleet.sizes import MiB, human_bytes

NOT_AVAILABLE = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}


class FactsError(OperationFailed):
    """Host output that cannot be understood (exit 1 for that host)."""


MAX_TEXT = 4096
"""Longest string kept from a host's fact (names, paths, versions); longer ones are cut."""
MAX_ERROR = 1000

T = TypeVar("T")


def _clean(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut at ``limit``, lone surrogates (JSON's ``"\\ud800"``, undecodable
    bytes escaped by the host) replaced by U+FFFD: the result can always be printed."""
    text = text[:limit]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _str(value: Any, limit: int = MAX_TEXT) -> str | None:
    """A string fact: strings kept (cleaned, cut at ``limit``), anything else is no value."""
    return _clean(value, limit) if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    """An integer fact (JSON ints; never bools or floats)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _error_text(value: Any) -> str:
    """A host-reported error as one short, redacted line."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)[:MAX_ERROR]
    text = " ".join(_clean(text, MAX_ERROR * 4).split())
    return redact_text(text[:MAX_ERROR])


def _guarded(errors: dict[str, str], name: str, fn: Callable[[], T], default: T) -> T:
    """``fn()``, or ``default`` with the part's error recorded: a parser bug or an odd
    value never fails the whole host."""
    try:
        return fn()
    except Exception as exc:
        errors[name] = f"could not understand the {name} fact ({type(exc).__name__})"
        return default


def parse_facts(doc: dict[str, Any]) -> HostFacts:
    """The facts script's answer (``{"parts": ...}``) -> HostFacts. A failed part lands
    in ``errors``."""
    parts = _dict(_dict(doc).get("parts"))
    errors: dict[str, str] = {}

    def value(name: str) -> Any:
        part = parts.get(name)
        if not isinstance(part, dict):
            return None
        if "error" in part:
            errors[name] = _error_text(part["error"])
            return None
        return part.get("value")

    facts = HostFacts()
    host = value("host")
    if isinstance(host, dict):
        facts.hostname = _str(host.get("hostname"))
    py = value("python")
    if isinstance(py, dict):
        facts.python = _str(py.get("version"))
        facts.python_executable = _str(py.get("executable"))

    vllm = value("vllm")
    models = value("models")
    allowlist = value("allowlist")
    facts.vllm = _guarded(errors, "vllm", lambda: parse_vllm(vllm, models, allowlist), VllmFacts())
    digests = value("files")
    if facts.vllm.installed and isinstance(digests, dict):
        facts.vllm.files = _guarded(errors, "files", lambda: parse_files(digests, errors), {})
    for rel, entry in _dict(_dict(models).get("files")).items():
        if isinstance(entry, dict) and "error" in entry:
            errors[f"models:{_error_text(rel)[:200]}"] = _error_text(entry["error"])

    gpus = value("gpus")
    if isinstance(gpus, dict):
        no_gpus: tuple[list[GpuInfo], str, str | None] = ([], "failed", None)
        gpu_part = _guarded(errors, "gpus", lambda: parse_gpu_part(gpus), no_gpus)
        facts.gpus, facts.nvidia_smi, gpu_error = gpu_part
        if gpu_error:
            errors["gpus"] = gpu_error
        facts.driver = driver_of(facts.gpus)
    sup = value("supervisors")
    if isinstance(sup, dict):
        facts.supervisors = _guarded(
            errors, "supervisors", lambda: parse_supervisors(sup), Supervisors()
        )
    procs = value("processes")
    if isinstance(procs, dict):
        facts.servers = _guarded(
            errors,
            "processes",
            lambda: parse_servers(_list(procs.get("processes")), errors),
            [],
        )
    disk = value("disk")
    if isinstance(disk, dict):
        no_disk: tuple[dict[str, DiskUsage], dict[str, str]] = ({}, {})
        facts.disk, disk_errors = _guarded(errors, "disk", lambda: parse_disk(disk), no_disk)
        errors.update(disk_errors)
    facts.errors = errors
    return facts


# -- vLLM and EAGLE-3 -------------------------------------------------------------------


def parse_vllm(vllm: Any, models: Any, allowlist: Any) -> VllmFacts:
    out = VllmFacts()
    if not isinstance(vllm, dict):
        return out
    out.path = _str(vllm.get("path"))
    out.version = _str(vllm.get("version"))
    out.version_source = _str(vllm.get("version_source"))
    out.installed = out.path is not None
    if not out.installed:
        return out
    files = models.get("files") if isinstance(models, dict) else None
    if isinstance(files, dict):
        for cls in EAGLE3_CLASSES:
            info = find_eagle3_class(files, cls)
            out.eagle3[cls] = None if info is None else info.supported
            if info is not None:
                out.eagle3_classes[cls] = info
    if isinstance(allowlist, dict):
        out.eagle3_allowlist = parse_allowlist(allowlist)
    return out


def parse_files(raw: dict[str, Any], errors: dict[str, str]) -> dict[str, VllmFile]:
    """{relpath: {"sha256", "size"} | {"missing": true} | {"error"}} -> VllmFile per path
    (an error lands in ``errors`` as ``files:<path>``)."""
    out: dict[str, VllmFile] = {}
    for rel, entry in raw.items():
        name = _error_text(rel)[:200]
        if not isinstance(entry, dict):
            continue
        if "error" in entry:
            errors[f"files:{name}"] = _error_text(entry["error"])
            continue
        if entry.get("missing") is True:
            out[name] = VllmFile(missing=True)
            continue
        sha = _str(entry.get("sha256"), 64)
        if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
            sha = None
        out[name] = VllmFile(sha256=sha, size=_int(entry.get("size")))
    return out


def find_eagle3_class(files: Any, name: str) -> Eagle3ClassInfo | None:
    """Look ``name`` up in every parsed file; judge it within the file that defines it."""
    for rel, entry in sorted(_dict(files).items(), key=lambda item: str(item[0])):
        classes = entry.get("classes") if isinstance(entry, dict) else None
        if isinstance(classes, dict) and name in classes:
            return eagle3_support(classes, name, _clean(str(rel)))
    return None


def _str_list(value: Any) -> list[str]:
    """A list of names: strings kept, anything else (a string alone, numbers) dropped."""
    return [_clean(v) for v in _list(value) if isinstance(v, str)]


def eagle3_support(classes: Any, name: str, file: str = "") -> Eagle3ClassInfo:
    """Does ``name`` list SupportsEagle3 among its bases, directly or through a base class
    defined in the same file? (``interfaces.SupportsEagle3`` counts as the interface.)
    The judgement is the one the on-host scripts make (:mod:`fleet.onhost.vllm_tree`);
    host strings are cleaned here."""
    judged = vllm_tree.eagle3_support(_dict(classes), name, file)
    for key in ("via", "bases", "methods"):
        judged[key] = [_clean(v) for v in judged[key]]
    return Eagle3ClassInfo.model_validate(judged)


def parse_allowlist(raw: Any) -> Eagle3Allowlist:
    """vLLM matches ``any(entry in hf_text_config.model_type for entry in allowlist)``
    (judged by :func:`fleet.onhost.vllm_tree.judge_allowlist`)."""
    judged = vllm_tree.judge_allowlist(_dict(raw))
    for key in ("file", "name"):
        judged[key] = _str(judged.get(key))
    if judged.get("entries") is not None:
        judged["entries"] = [_clean(e) for e in judged["entries"]]
    admits: dict[str, bool] = judged["admits"]
    return Eagle3Allowlist(
        **judged,
        deepseek=any(v for t, v in admits.items() if t.startswith("deepseek")),
        kimi=any(v for t, v in admits.items() if t.startswith("kimi")),
    )


# -- GPUs -------------------------------------------------------------------------------

_ASCII_INT = re.compile(r"[+-]?[0-9]{1,18}")
_ASCII_NUMBER = re.compile(r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]*)?|\.[0-9]+)")


def _number(text: str) -> int | None:
    """A MiB count from nvidia-smi: ASCII digits (``183359``, ``40960 MiB``, ``1.5``);
    ``[N/A]`` and anything else is no value (never Unicode digits, inf or nan)."""
    value = text.strip()
    if value.lower() in NOT_AVAILABLE:
        return None
    for unit in (" MiB", "MiB"):
        if value.endswith(unit):
            value = value[: -len(unit)].strip()
    if not _ASCII_NUMBER.fullmatch(value):
        return None
    number = float(value)
    return int(number) if math.isfinite(number) else None


def _text(text: str) -> str | None:
    value = text.strip()
    return None if value.lower() in NOT_AVAILABLE else _clean(value)


def parse_nvidia_smi(csv_text: str) -> list[GpuInfo]:
    """``nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version
    --format=csv,noheader,nounits`` -> GPUs. ``[N/A]``/``[Not Supported]`` become None; a
    name holding commas is kept whole (the fields around it are fixed).

    A line that is not a GPU raises :class:`FactsError` (the GPU fact's error); nothing
    else is raised."""
    gpus: list[GpuInfo] = []
    for raw_line in str(csv_text).splitlines():
        line = raw_line.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5:
            raise FactsError(
                f"nvidia-smi line has {len(fields)} fields, expected 5: {line[:200]!r}"
            )
        if not _ASCII_INT.fullmatch(fields[0]) or int(fields[0]) < 0:
            if fields[0].lower() == "index":  # a header line, if noheader was ignored
                continue
            raise FactsError(f"nvidia-smi line does not start with a GPU index: {line[:200]!r}")
        gpus.append(
            GpuInfo(
                index=int(fields[0]),
                name=_clean(", ".join(fields[1:-3])),
                memory_total_mib=_number(fields[-3]),
                memory_used_mib=_number(fields[-2]),
                driver_version=_text(fields[-1]),
            )
        )
    return gpus


NO_DEVICES = "No devices were found"


def parse_gpu_part(raw: Any) -> tuple[list[GpuInfo], str, str | None]:
    """(gpus, status, error): status "ok", "missing" (no nvidia-smi: no GPUs, no error)
    or "failed" (nvidia-smi ran and failed, e.g. the driver is not loaded)."""
    raw = _dict(raw)
    if raw.get("missing"):
        return [], "missing", None
    if raw.get("timeout"):
        return [], "failed", "nvidia-smi timed out"
    stdout = _str(raw.get("stdout"), 1 << 24) or ""
    stderr = _str(raw.get("stderr"), 1 << 20) or ""
    code = raw.get("exit_code")
    if NO_DEVICES in stdout or NO_DEVICES in stderr:
        return [], "ok", None
    if code != 0 or isinstance(code, bool):
        last = (stderr.strip().splitlines() or stdout.strip().splitlines() or [""])[0]
        shown = code if _int(code) is not None else _error_text(code)[:40]
        return [], "failed", _error_text(f"nvidia-smi exited {shown}: {last}").rstrip(": ")
    try:
        return parse_nvidia_smi(stdout), "ok", None
    except FactsError as exc:
        return [], "failed", exc.message


def driver_of(gpus: list[GpuInfo]) -> str | None:
    versions = sorted({g.driver_version for g in gpus if g.driver_version})
    return ", ".join(versions) if versions else None


def gpu_summary(gpus: list[GpuInfo]) -> str:
    """ "8 × NVIDIA B200 (179 GiB)"; mixed models are joined with " + "."""
    if not gpus:
        return "no GPUs"
    groups: Counter[tuple[str, int | None]] = Counter((g.name, g.memory_total_mib) for g in gpus)
    parts = []
    for (name, mib), count in groups.items():
        size = f" ({human_bytes(mib * MiB, spec='.0f', units=('GiB',))})" if mib else ""
        parts.append(f"{count} × {name}{size}")
    return " + ".join(parts)


# -- supervisors, servers, disk ---------------------------------------------------------


def parse_supervisors(raw: Any) -> Supervisors:
    raw = _dict(raw)
    tools = _dict(raw.get("tools"))
    pid1 = _str(raw.get("pid1"))
    systemd = raw.get("systemd_booted") is True and pid1 == "systemd"
    sup = Supervisors(
        systemd=systemd,
        pid1=pid1,
        systemctl=_str(tools.get("systemctl")),
        supervisord=_str(tools.get("supervisord")),
        supervisorctl=_str(tools.get("supervisorctl")),
    )
    if sup.systemd and sup.systemctl:
        sup.available.append("systemd")
    if sup.supervisord and sup.supervisorctl:
        sup.available.append("supervisord")
    return sup


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :]
    return None


def _port(text: str | None) -> int | None:
    """A TCP port from a command line: ASCII digits only (``str.isdigit`` also takes
    ``²`` and ``٣``, which ``int`` then refuses), 1-65535."""
    if text is None or not re.fullmatch(r"[0-9]{1,5}", text):
        return None
    port = int(text)
    return port if 1 <= port <= 65535 else None


def server_args(argv: list[str]) -> list[str] | None:
    """The arguments after ``vllm serve`` / ``-m vllm.entrypoints...``, or None when the
    command line is not a vLLM server (a shell, ``grep vllm``, a worker...)."""
    words = [a for a in _list(argv) if isinstance(a, str)]
    for i, arg in enumerate(words[:-1]):
        if os.path.basename(arg) == "vllm" and words[i + 1] == "serve":
            return words[i + 2 :]
        if arg == "-m" and words[i + 1].startswith("vllm.entrypoints"):
            rest = words[i + 2 :]
            return rest[1:] if rest[:1] == ["serve"] else rest
    return None


def _children_of(processes: list[Any]) -> dict[int, list[dict[str, Any]]]:
    children: dict[int, list[dict[str, Any]]] = {}
    for proc in processes:
        if isinstance(proc, dict) and _int(proc.get("ppid")) is not None:
            children.setdefault(proc["ppid"], []).append(proc)
    return children


def _descendants(
    pid: int, processes: list[Any], children: dict[int, list[dict[str, Any]]] | None = None
) -> list[str]:
    if children is None:
        children = _children_of(processes)
    out: list[str] = []
    todo, seen = deque([pid]), {pid}
    while todo:
        for child in children.get(todo.popleft(), []):
            child_pid = _int(child.get("pid"))
            if child_pid is None or child_pid in seen:
                continue
            seen.add(child_pid)
            todo.append(child_pid)
            argv = _list(child.get("argv"))
            first = argv[0] if argv and isinstance(argv[0], str) else ""
            out.append(redact_text(_clean(first.strip())))
    return out


def parse_servers(processes: Any, errors: dict[str, str] | None = None) -> list[VllmServer]:
    """vLLM API servers among the processes (``vllm serve`` or ``-m vllm.entrypoints``);
    their vLLM child processes (engine cores, workers) are listed as descendants.

    Command lines can hold secrets (``--api-key KEY``): the argv kept is redacted. A
    process entry that cannot be understood is skipped (counted in ``errors``)."""
    entries = _list(processes)
    children = _children_of(entries)
    servers = []
    odd = 0
    for proc in entries:
        if not isinstance(proc, dict):
            odd += 1
            continue
        argv = [_clean(a) for a in _list(proc.get("argv")) if isinstance(a, str)]
        args = server_args(argv)
        if args is None:
            continue
        pid = _int(proc.get("pid"))
        if pid is None or not 0 <= pid < 1 << 31:
            odd += 1
            continue
        model = args[0] if args and not args[0].startswith("-") else _option(args, "--model")
        uid = _int(proc.get("uid"))
        servers.append(
            VllmServer(
                pid=pid,
                argv=redact_argv(argv),
                model=redact_text(model) if model else model,
                port=_port(_option(args, "--port")),
                host=_option(args, "--host"),
                uid=uid if uid is not None and 0 <= uid < 1 << 32 else None,
                descendants=_descendants(pid, entries, children),
            )
        )
    if odd and errors is not None:
        errors["processes"] = f"{odd} process entries could not be understood"
    return servers


def _byte_count(value: Any) -> int | None:
    number = _int(value)
    if number is None and isinstance(value, float) and math.isfinite(value):
        number = int(value)
    return number if number is not None and 0 <= number < 1 << 63 else None


def parse_disk(raw: Any) -> tuple[dict[str, DiskUsage], dict[str, str]]:
    disk: dict[str, DiskUsage] = {}
    errors: dict[str, str] = {}
    for key, entry in _dict(raw).items():
        if not isinstance(entry, dict):
            continue
        name = _clean(str(key), 200)
        if "error" in entry:
            errors[f"disk:{name}"] = _error_text(entry["error"])
            continue
        path = _str(entry.get("path"))
        sizes = [_byte_count(entry.get(k)) for k in ("total", "used", "free")]
        if path is None or any(s is None for s in sizes):
            errors[f"disk:{name}"] = "unexpected disk usage data from the host"
            continue
        total, used, free = (s or 0 for s in sizes)
        disk[name] = DiskUsage(path=path, total_bytes=total, used_bytes=used, free_bytes=free)
    return disk, errors

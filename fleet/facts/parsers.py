"""Pure parsers: raw observations of ``remote_facts.py`` -> :class:`HostFacts`.

Nothing here touches the network or the file system; every function takes text or the
decoded JSON of the remote script and returns models, so each is unit-tested on recorded
outputs (tests/fixtures/facts/).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

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
    VllmServer,
)
from fleet.onhost import vllm_tree
from fleet.redact import redact_argv, redact_text

NOT_AVAILABLE = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}


class FactsError(OperationFailed):
    """Host output that cannot be understood (exit 1 for that host)."""


def parse_facts(doc: dict[str, Any]) -> HostFacts:
    """The facts script's answer (``{"parts": ...}``) -> HostFacts. A failed part lands in
    ``errors``."""
    parts: dict[str, Any] = doc["parts"]
    errors: dict[str, str] = {}

    def value(name: str) -> Any:
        part = parts.get(name)
        if not isinstance(part, dict):
            return None
        if "error" in part:
            errors[name] = str(part["error"])
            return None
        return part.get("value")

    facts = HostFacts()
    host = value("host")
    if isinstance(host, dict):
        facts.hostname = host.get("hostname")
    py = value("python")
    if isinstance(py, dict):
        facts.python = py.get("version")
        facts.python_executable = py.get("executable")

    vllm = value("vllm")
    models = value("models")
    allowlist = value("allowlist")
    facts.vllm = parse_vllm(vllm, models, allowlist)
    if isinstance(models, dict):
        for rel, entry in (models.get("files") or {}).items():
            if isinstance(entry, dict) and "error" in entry:
                errors[f"models:{rel}"] = str(entry["error"])

    gpus = value("gpus")
    if isinstance(gpus, dict):
        facts.gpus, facts.nvidia_smi, gpu_error = parse_gpu_part(gpus)
        if gpu_error:
            errors["gpus"] = gpu_error
        facts.driver = driver_of(facts.gpus)
    sup = value("supervisors")
    if isinstance(sup, dict):
        facts.supervisors = parse_supervisors(sup)
    procs = value("processes")
    if isinstance(procs, dict):
        facts.servers = parse_servers(procs.get("processes") or [])
    disk = value("disk")
    if isinstance(disk, dict):
        facts.disk, disk_errors = parse_disk(disk)
        errors.update(disk_errors)
    facts.errors = errors
    return facts


# -- vLLM and EAGLE-3 -------------------------------------------------------------------


def parse_vllm(vllm: Any, models: Any, allowlist: Any) -> VllmFacts:
    out = VllmFacts()
    if not isinstance(vllm, dict):
        return out
    out.path = vllm.get("path")
    out.version = vllm.get("version")
    out.version_source = vllm.get("version_source")
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


def find_eagle3_class(files: dict[str, Any], name: str) -> Eagle3ClassInfo | None:
    """Look ``name`` up in every parsed file; judge it within the file that defines it
    (the same judgement the on-host scripts make: :mod:`fleet.onhost.vllm_tree`)."""
    found = vllm_tree.find_class(files, name)
    return None if found is None else Eagle3ClassInfo.model_validate(found)


def eagle3_support(classes: dict[str, Any], name: str, file: str = "") -> Eagle3ClassInfo:
    """Does ``name`` list SupportsEagle3 among its bases, directly or through a base class
    defined in the same file? (``interfaces.SupportsEagle3`` counts as the interface.)"""
    return Eagle3ClassInfo.model_validate(vllm_tree.eagle3_support(classes, name, file))


def parse_allowlist(raw: dict[str, Any]) -> Eagle3Allowlist:
    """vLLM matches ``any(entry in hf_text_config.model_type for entry in allowlist)``."""
    judged = vllm_tree.judge_allowlist(raw)
    admits: dict[str, bool] = judged["admits"]
    return Eagle3Allowlist(
        **judged,
        deepseek=any(v for t, v in admits.items() if t.startswith("deepseek")),
        kimi=any(v for t, v in admits.items() if t.startswith("kimi")),
    )


# -- GPUs -------------------------------------------------------------------------------


def _number(text: str) -> int | None:
    value = text.strip()
    if value.lower() in NOT_AVAILABLE:
        return None
    for unit in (" MiB", "MiB"):
        if value.endswith(unit):
            value = value[: -len(unit)].strip()
    try:
        return int(float(value))
    except ValueError:
        return None


def _text(text: str) -> str | None:
    value = text.strip()
    return None if value.lower() in NOT_AVAILABLE else value


def parse_nvidia_smi(csv_text: str) -> list[GpuInfo]:
    """``nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version
    --format=csv,noheader,nounits`` -> GPUs. ``[N/A]``/``[Not Supported]`` become None; a
    name holding commas is kept whole (the fields around it are fixed)."""
    gpus: list[GpuInfo] = []
    for raw_line in csv_text.splitlines():
        line = raw_line.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5:
            raise FactsError(f"nvidia-smi line has {len(fields)} fields, expected 5: {line!r}")
        try:
            index = int(fields[0])
        except ValueError:
            if fields[0].lower() == "index":  # a header line, if noheader was ignored
                continue
            raise FactsError(f"nvidia-smi line does not start with a GPU index: {line!r}") from None
        gpus.append(
            GpuInfo(
                index=index,
                name=", ".join(fields[1:-3]),
                memory_total_mib=_number(fields[-3]),
                memory_used_mib=_number(fields[-2]),
                driver_version=_text(fields[-1]),
            )
        )
    return gpus


NO_DEVICES = "No devices were found"


def parse_gpu_part(raw: dict[str, Any]) -> tuple[list[GpuInfo], str, str | None]:
    """(gpus, status, error): status "ok", "missing" (no nvidia-smi: no GPUs, no error)
    or "failed" (nvidia-smi ran and failed, e.g. the driver is not loaded)."""
    if raw.get("missing"):
        return [], "missing", None
    if raw.get("timeout"):
        return [], "failed", "nvidia-smi timed out"
    stdout = str(raw.get("stdout") or "")
    stderr = str(raw.get("stderr") or "")
    code = raw.get("exit_code")
    if NO_DEVICES in stdout or NO_DEVICES in stderr:
        return [], "ok", None
    if code != 0:
        last = (stderr.strip().splitlines() or stdout.strip().splitlines() or [""])[0]
        return [], "failed", f"nvidia-smi exited {code}: {last}".rstrip(": ")
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
        size = f" ({mib / 1024:.0f} GiB)" if mib else ""
        parts.append(f"{count} × {name}{size}")
    return " + ".join(parts)


# -- supervisors, servers, disk ---------------------------------------------------------


def parse_supervisors(raw: dict[str, Any]) -> Supervisors:
    tools = raw.get("tools") or {}
    pid1 = raw.get("pid1")
    systemd = bool(raw.get("systemd_booted")) and pid1 == "systemd"
    sup = Supervisors(
        systemd=systemd,
        pid1=pid1,
        systemctl=tools.get("systemctl"),
        supervisord=tools.get("supervisord"),
        supervisorctl=tools.get("supervisorctl"),
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


def server_args(argv: list[str]) -> list[str] | None:
    """The arguments after ``vllm serve`` / ``-m vllm.entrypoints...``, or None when the
    command line is not a vLLM server (a shell, ``grep vllm``, a worker...)."""
    for i, arg in enumerate(argv[:-1]):
        if os.path.basename(arg) == "vllm" and argv[i + 1] == "serve":
            return argv[i + 2 :]
        if arg == "-m" and argv[i + 1].startswith("vllm.entrypoints"):
            rest = argv[i + 2 :]
            return rest[1:] if rest[:1] == ["serve"] else rest
    return None


def _descendants(pid: int, processes: list[dict[str, Any]]) -> list[str]:
    children: dict[int, list[dict[str, Any]]] = {}
    for proc in processes:
        if isinstance(proc.get("ppid"), int):
            children.setdefault(proc["ppid"], []).append(proc)
    out: list[str] = []
    todo, seen = [pid], {pid}
    while todo:
        for child in children.get(todo.pop(0), []):
            if child["pid"] not in seen:
                seen.add(child["pid"])
                todo.append(child["pid"])
                argv = child.get("argv") or [""]
                out.append(redact_text(str(argv[0]).strip()))
    return out


def parse_servers(processes: list[dict[str, Any]]) -> list[VllmServer]:
    """vLLM API servers among the processes (``vllm serve`` or ``-m vllm.entrypoints``);
    their vLLM child processes (engine cores, workers) are listed as descendants.

    Command lines can hold secrets (``--api-key KEY``): the argv kept is redacted."""
    servers = []
    for proc in processes:
        argv = [str(a) for a in proc.get("argv") or []]
        args = server_args(argv)
        if args is None:
            continue
        model = args[0] if args and not args[0].startswith("-") else _option(args, "--model")
        port_text = _option(args, "--port")
        port = int(port_text) if port_text and port_text.isdigit() else None
        servers.append(
            VllmServer(
                pid=int(proc["pid"]),
                argv=redact_argv(argv),
                model=redact_text(model) if model else model,
                port=port,
                host=_option(args, "--host"),
                uid=proc.get("uid"),
                descendants=_descendants(int(proc["pid"]), processes),
            )
        )
    return servers


def parse_disk(raw: dict[str, Any]) -> tuple[dict[str, DiskUsage], dict[str, str]]:
    disk: dict[str, DiskUsage] = {}
    errors: dict[str, str] = {}
    for key, entry in raw.items():
        if not isinstance(entry, dict):
            continue
        if "error" in entry:
            errors[f"disk:{key}"] = str(entry["error"])
            continue
        disk[key] = DiskUsage(
            path=str(entry["path"]),
            total_bytes=int(entry["total"]),
            used_bytes=int(entry["used"]),
            free_bytes=int(entry["free"]),
        )
    return disk, errors

"""Line normalisation: strip what terminals, CI systems and vLLM's logger put around a message.

A raw line such as::

    2025-09-28T15:47:24.1Z (EngineCore_DP0 pid=17374) \x1b[1;31mERROR\x1b[0m 09-28 15:47:24 \
        [core.py:718] ValueError: ...

becomes ``ValueError: ...`` with ``proc="EngineCore_DP0"`` and ``level="ERROR"``. Traceback
lines keep their indentation (``  File ...``), which the engine relies on.

The prefixes are data: :data:`SHAPES` is a table of header shapes (vLLM's own formats of
0.10-0.33, Ray, uvicorn, Python logging, torch/glog, CI systems, journald, docker compose,
kubectl, containerd, Slurm/MPI/torchrun tags, GitHub quote prefixes). Each shape names
what it is, which kind of prefix it is (``outer``: added around the process's output;
``proc``: a process tag; ``level``: the logger's level/time/file header) and real examples;
``tests/unit/test_diag_normalize.py`` checks every example of every shape. The shapes are
applied repeatedly, so stacked prefixes (``> 12 | vllm-1 | (APIServer pid=1)
(EngineCore_DP0 pid=68) ERROR ...``) come off in any order.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

# ANSI/VT100: CSI sequences, OSC (title, hyperlinks), APC (Buildkite's ``\x1b_bk;t=...\x07``
# timestamps), and two-character escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]_^P][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# SGR colour codes whose ESC byte was lost when a log was pasted into a web page
# ("[36m(RayWorkerWrapper pid=1)[0m"), and the "^M" a pager prints for a carriage return.
_ORPHAN_SGR = re.compile(r"(?<![\w\[\]])\[(?:\d{1,3};){0,4}\d{1,3}m")
_CARET_M = re.compile(r"(?:\^M)+$")
# rsyslog/journald exports escape control characters as "#" + octal: "#033[1;36m" is an
# ANSI colour code, a trailing "#015" the carriage return of a CRLF line.
_SYSLOG_ESC = re.compile(r"#033\[[0-?]*[ -/]*[@-~]|(?:#015)+$")

# CI logs and `cat -v` show ESC as "^[": "^[[1;36m(APIServer pid=1)^[[0;0m ERROR ...".
_CARET_ESC = re.compile(r"\^\[\[[0-?]*[ -/]*[@-~]|\^\[[\]_^P][^\x07]*?(?:\^G|\x07)")
# A log viewer drawing a box (k9s, Lens, `kubectl` TUIs): "│ INFO ... │".
_BOX_RIGHT = re.compile(r"\s*[│┃║]\s*$")

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

Kind = Literal["outer", "proc", "level"]

_LEVEL_WORDS = {
    "D": "DEBUG",
    "I": "INFO",
    "W": "WARNING",
    "E": "ERROR",
    "C": "CRITICAL",
    "F": "FATAL",
    "WARN": "WARNING",
    "ERR": "ERROR",
    "CRIT": "CRITICAL",
    "DEBUG": "DEBUG",
    "INFO": "INFO",
    "WARNING": "WARNING",
    "ERROR": "ERROR",
    "CRITICAL": "CRITICAL",
    "FATAL": "FATAL",
}
_LV = r"DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL"
# vLLM's time stamp: "%m-%d %H:%M:%S" (0.10-0.33 default) or a full date with fractions
# (custom VLLM_LOGGING_CONFIG_PATH, older forks): "2026-04-25 10:01:17.340".
_VTIME = r"(?:\d{4}-)?\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?"


@dataclass(frozen=True)
class HeaderShape:
    """One kind of line prefix: a regex anchored at the start of the (partly stripped) line.

    ``proc``/``level`` named groups give the process tag and the log level; ``examples`` are
    ``(raw line, text after normalisation, proc, level)`` tuples, checked by the tests."""

    name: str
    kind: Kind
    regex: str
    examples: tuple[tuple[str, str, str | None, str | None], ...] = ()
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", re.compile(self.regex))


_M = "ValueError: No available memory for the cache blocks."

SHAPES: tuple[HeaderShape, ...] = (
    # ---------------------------------------------------------------- outer (collectors, CI)
    HeaderShape(
        "github-quote",
        "outer",
        r">(?:[ \t]+\|)?(?:[ \t]|$)",
        (
            (f"> {_M}", _M, None, None),
            (f"> > {_M}", _M, None, None),
            (
                f">   | (EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:1] {_M}",
                _M,
                "EngineCore_DP0",
                "ERROR",
            ),
        ),
    ),
    HeaderShape(
        "iso-timestamp",
        "outer",
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s",
        (
            (f"2025-09-28T15:47:24.1234567Z {_M}", _M, None, None),
            (f"2025-09-28T15:47:24+0000 {_M}", _M, None, None),
        ),
    ),
    HeaderShape(
        "containerd-cri",
        "outer",
        r"(?:stdout|stderr) [FP] ",
        ((f"2025-09-28T15:47:24.123456789Z stderr F {_M}", _M, None, None),),
    ),
    HeaderShape(
        "bracketed-timestamp",
        "outer",
        r"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]\s?",
        (
            (f"[2025-09-28 15:47:24] {_M}", _M, None, None),
            (f"[2025-09-28T15:47:24Z] {_M}", _M, None, None),
        ),
    ),
    HeaderShape(
        "buildkite-timestamp",
        "outer",
        r"_bk;t=(?:\d{13}|\d{10})(?:\x07)?",
        ((f"_bk;t=1727531244123{_M}", _M, None, None),),
    ),
    HeaderShape(
        "plain-timestamp",
        "outer",
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?:\s+\|)?\s+",
        ((f"2025-09-28 15:47:24,123 {_M}", _M, None, None),),
    ),
    HeaderShape(
        "python-logging-dashes",
        "level",
        rf"(?:-\s+)?(?:[\w.\-]+ - )?(?P<level>{_LV}) - (?:[\w.\-]+ - )?",
        (
            (f"2025-09-28 15:47:24,123 - vllm.engine - ERROR - {_M}", _M, None, "ERROR"),
            (f"2025-09-28 15:47:24,123 - ERROR - {_M}", _M, None, "ERROR"),
        ),
    ),
    HeaderShape(
        "web-log-line-number",
        "outer",
        r"\s{0,6}\d{1,7}\s?[|│]\s?",
        (
            (f"  123 | (EngineCore_DP0 pid=1) {_M}", _M, "EngineCore_DP0", None),
            (f"123│{_M}", _M, None, None),
        ),
    ),
    HeaderShape("tab-line-number", "outer", r"\d{1,7}\t", ((f"12\t{_M}", _M, None, None),)),
    HeaderShape(
        "box-border",
        "outer",
        r"[│┃║][ \t]?",
        (
            (f"│ {_M}    │", _M, None, None),
            (
                "│ INFO 03-21 20:19:24 [launcher.py:34] Route: /v1/models, Methods: GET   │",
                "Route: /v1/models, Methods: GET",
                None,
                "INFO",
            ),
        ),
    ),
    HeaderShape(
        "syslog-journald",
        "outer",
        r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@/\-]+(?:\[\d+\])?: ",
        ((f"Sep 28 15:47:24 gpu-01 vllm[1234]: {_M}", _M, None, None),),
    ),
    HeaderShape(
        "journald-iso-host",
        "outer",
        r"[\w.\-]+ [\w.@/\-]+\[\d+\]: ",
        ((f"2025-09-28T15:47:24+0000 gpu-01 vllm[1234]: {_M}", _M, None, None),),
    ),
    HeaderShape(
        "docker-compose",
        "outer",
        r"(?!(?:TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR|CRITICAL)\s)[\w.\-]+(?:[-_]\d+)?\s+\| ",
        (
            (
                f"vllm-1  | (EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:1] {_M}",
                _M,
                "EngineCore_DP0",
                "ERROR",
            ),
            (f"vllm_server_1  | {_M}", _M, None, None),
        ),
    ),
    HeaderShape(
        # a line pasted into an issue in Markdown emphasis or inline code; the closing
        # marker at the end of the line comes off too
        "markdown-wrap",
        "outer",
        r"(?P<md>\*\*|`{1,3})(?=[^\s*`])",
        (
            (f"**{_M}**", _M, None, None),
            (f"`{_M}`", _M, None, None),
            (
                f"> **(EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:1] {_M}**",
                _M,
                "EngineCore_DP0",
                "ERROR",
            ),
        ),
    ),
    HeaderShape(
        "kubectl-prefix",
        "outer",
        r"\[pod/[^\]\s]+\]\s",
        ((f"[pod/vllm-0/vllm] {_M}", _M, None, None),),
    ),
    HeaderShape(
        "torch-rank",
        "outer",
        r"\[rank\d+\]:\s?",
        ((f"[rank0]: {_M}", _M, None, None),),
    ),
    HeaderShape(
        "bracket-tag",
        "outer",
        r"\[[A-Za-z][\w.\-]{0,40}\]:\s",
        ((f"[vllm]: {_M}", _M, None, None),),
    ),
    HeaderShape(
        # a launcher's stream tag in front of a process tag, a level or a frame
        # ("[container] (EngineCore pid=695)   File ...") -- never fleet's own marker, never
        # a level ("[Error] (Process) ..." is bracketed-level's)
        "launcher-tag",
        "outer",
        r"\[(?!fleet\]|(?i:debug|info|warn|warning|error|critical|fatal)\])[A-Za-z][\w.\-]{0,40}\] "
        r"(?=\(|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|\s*File \")",
        (
            (
                f"[container] (EngineCore pid=695) {_M}",
                _M,
                "EngineCore",
                None,
            ),
        ),
    ),
    HeaderShape(
        "torchrun-tee",
        "outer",
        r"\[default\d+\]:",
        ((f"[default0]:{_M}", _M, None, None),),
    ),
    HeaderShape(
        "mpi-tag-output",
        "outer",
        r"\[\d+,\d+\]<std(?:out|err)>:\s?",
        ((f"[1,0]<stderr>:{_M}", _M, None, None),),
    ),
    HeaderShape(
        "slurm-label",
        "outer",
        r"\d{1,4}: (?=\(|[A-Z]|\s+File |Traceback)",
        ((f"3: {_M}", _M, None, None),),
    ),
    HeaderShape(
        "pytest-error",
        "outer",
        r"E(?: {3,}|\t)",
        ((f"E       {_M}", _M, None, None),),
    ),
    HeaderShape(
        "ray-cpp",
        "level",
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? (?P<level>[DIWEF]) \d+ \d+\]\s",
        ((f"[2024-05-06 14:20:15,123 E 2211 2300] {_M}", _M, None, "ERROR"),),
    ),
    HeaderShape(
        "glog-torch-c10",
        "level",
        r"\[(?P<level>[DIWECF])(?:\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ )?\s?[\w./\-]+:\d+\]\s",
        (
            (f"[E ProcessGroupNCCL.cpp:563] {_M}", _M, None, "ERROR"),
            (
                f"[rank1]:[E1001 12:00:00.123456 1234 ProcessGroupNCCL.cpp:1234] {_M}",
                _M,
                None,
                "ERROR",
            ),
            (f"[W socket.cpp:464] {_M}", _M, None, "WARNING"),
        ),
    ),
    HeaderShape(
        "glog",
        "level",
        r"(?P<level>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w./\-]+:\d+\]\s",
        ((f"E0928 15:47:24.123456  1234 core_worker.cc:12] {_M}", _M, None, "ERROR"),),
    ),
    HeaderShape(
        # NCCL_DEBUG output: "host:pid:tid [dev] NCCL INFO ...", possibly behind a pdsh /
        # mpirun host tag ("node2: ")
        "nccl-debug",
        "level",
        r"(?:[\w.\-]+: )?[\w.\-]+:\d+:\d+ \[\d+\] NCCL (?P<level>INFO|WARN|TRACE)\b ?",
        (
            (
                "h100-2:413:413 [1] NCCL INFO NET/Plugin: Plugin load returned 2 : "
                "libnccl-net.so: cannot open shared object file: No such file or directory",
                "NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared "
                "object file: No such file or directory",
                None,
                "INFO",
            ),
            (
                "node2: node2:10792:10792 [0] NCCL WARN Cuda failure 'out of memory'",
                "Cuda failure 'out of memory'",
                None,
                "WARNING",
            ),
        ),
    ),
    # ---------------------------------------------------------------- process tags
    HeaderShape(
        "rank-pid-tags",
        "proc",
        r"\[\d+/\d+,(?P<proc>\w+)\]\[pid=\d+\]\s?",
        (
            (
                f"[1/8,TP1][pid=5510] ERROR 01-28 10:47:07.623 [forward_context.py:617] {_M}",
                _M,
                "TP1",
                "ERROR",
            ),
        ),
    ),
    HeaderShape(
        "vllm-process",
        "proc",
        r"\((?P<proc>[A-Za-z_][\w.:\-]*(?:\s(?:TP|DP|PP|EP)\d+\w*)?)(?:,?\s+\w+=[^,()\s]+)*?,?\s+pid=\d+"
        r"(?:,\s*\w+=[^,()\s]*)*\)\s?",
        (
            (
                f"(VllmWorker TP2 pid=415) ERROR 08-31 04:18:45 [multiproc_executor.py:559] {_M}",
                _M,
                "VllmWorker TP2",
                "ERROR",
            ),
            (
                f"(EngineCore_DP0 pid=17374) ERROR 09-28 15:47:24 [core.py:718] {_M}",
                _M,
                "EngineCore_DP0",
                "ERROR",
            ),
            (
                f"(APIServer pid=1) (EngineCore_DP0 pid=68) ERROR 09-28 15:47:24 [core.py:1] {_M}",
                _M,
                "EngineCore_DP0",
                "ERROR",
            ),
            (
                f"(VllmWorker rank=2 pid=1234) ERROR 05-06 14:20:15 [multiproc_executor.py:1] {_M}",
                _M,
                "VllmWorker",
                "ERROR",
            ),
            (f"(RayWorkerWrapper pid=2211, ip=10.0.0.12) {_M}", _M, "RayWorkerWrapper", None),
            (f"(head, rank=0, pid=1234) {_M}", _M, "head", None),
            (
                f"(ServeReplica:default:VLLMDeployment pid=88) {_M}",
                _M,
                "ServeReplica:default:VLLMDeployment",
                None,
            ),
        ),
    ),
    HeaderShape(
        "bare-pid",
        "proc",
        r"\(pid=(?P<pid>\d+)(?:,\s*ip=[^)\s]*)?\)\s?",
        ((f"(pid=77) {_M}", _M, "pid77", None), (f"(pid=77, ip=10.0.0.3) {_M}", _M, "pid77", None)),
    ),
    HeaderShape(
        "ray-system",
        "proc",
        r"\((?P<proc>raylet|gcs_server|autoscaler|monitor|dashboard\w*|log_monitor)"
        r"(?:,\s*ip=[^)\s]*|\s+\+[\dhms]+)?\)\s?",
        (
            (f"(raylet, ip=10.0.0.2) {_M}", _M, "raylet", None),
            (f"(autoscaler +2m3s) {_M}", _M, "autoscaler", None),
        ),
    ),
    # ---------------------------------------------------------------- logger headers
    HeaderShape(
        "vllm-logger",
        "level",
        rf"(?P<level>{_LV})\s+(?:{_VTIME}\s+)?(?:\[[^\]\s]+:\d+\]|[\w.\-/]+:\d+\])\s?",
        (
            (f"ERROR 09-28 15:47:24 [core.py:718] {_M}", _M, None, "ERROR"),
            (f"ERROR 2026-04-25 10:01:17.340 [file.py:246] {_M}", _M, None, "ERROR"),
            (f"ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] {_M}", _M, None, "ERROR"),
            (
                f"WARNING 09-28 15:47:24 [model_executor/.../fp8_utils.py:12] {_M}",
                _M,
                None,
                "WARNING",
            ),
        ),
    ),
    HeaderShape(
        "vllm-logger-no-file",
        "level",
        rf"(?P<level>{_LV})\s+{_VTIME}\s+",
        ((f"ERROR 2026-04-25 10:01:17.340 {_M}", _M, None, "ERROR"),),
    ),
    HeaderShape(
        "uvicorn-python-default",
        "level",
        r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?:[\w.]+:|\s+)",
        ((f"ERROR:    {_M}", _M, None, "ERROR"), (f"ERROR:root:{_M}", _M, None, "ERROR")),
    ),
    HeaderShape(
        "kserve",
        "level",
        rf"\d+ [\w.\-]+ (?P<level>{_LV}) \[[^\]\s]+\]\s",
        (
            (
                f"2024-07-01 07:28:04.488 1 kserve ERROR [__main__.py:<module>():254] {_M}",
                _M,
                None,
                "ERROR",
            ),
        ),
    ),
    HeaderShape(
        # FastChat's logger (``build_logger``), relaying a worker's stderr line by line
        "fastchat-stream",
        "level",
        r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \| [\w.\-]+ \| ",
        (
            (
                "2023-12-12 19:38:39 | ERROR | stderr | Traceback (most recent call last):",
                "Traceback (most recent call last):",
                None,
                "ERROR",
            ),
        ),
    ),
    HeaderShape(
        "loguru",
        "level",
        r"(?P<level>TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR|CRITICAL)\s*"
        r"\| [\w.<>\-]+:[\w.<>\-]+:\d+ - ",
        ((f"2024-05-06 14:20:15.123 | ERROR    | verl.workers:init:12 - {_M}", _M, None, "ERROR"),),
    ),
    HeaderShape(
        "bracketed-level",
        "level",
        rf"\[(?P<level>(?i:{_LV}))\]\s",
        (
            (f"[ERROR] {_M}", _M, None, "ERROR"),
            (
                f"2026-06-09 14:01:52.982 [Error] (Process) (EngineCore pid=42521) ERROR 06-09 "
                f"14:01:52 [core.py:1136] {_M}",
                _M,
                "EngineCore",
                "ERROR",
            ),
        ),
    ),
    HeaderShape(
        "launcher-stream-tag",
        "outer",
        r"\((?:Process|Server|Stdout|Stderr|stdout|stderr)\)\s",
        ((f"[Error] (Process) {_M}", _M, None, "ERROR"),),
    ),
    HeaderShape(
        "github-actions-command",
        "level",
        r"##\[(?P<level>error|warning)\]",
        ((f"##[error]{_M}", _M, None, "ERROR"),),
    ),
)

_OUTER = tuple(s.pattern for s in SHAPES if s.kind == "outer")
_MARKDOWN = next(s.pattern for s in SHAPES if s.name == "markdown-wrap")
_PROC_LEVEL = tuple(s for s in SHAPES if s.kind != "outer")
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_MAX_ROUNDS = 8


@dataclass(frozen=True)
class Normalized:
    text: str
    proc: str | None = None
    level: str | None = None
    level_shape: str | None = None  # the name of the header shape that gave ``level``


def strip_ansi(text: str) -> str:
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text


def last_segment(text: str) -> str:
    """What a terminal shows for a line rewritten with carriage returns (progress bars)."""
    if "\r" not in text:
        return text
    for part in reversed(text.split("\r")):
        if part.strip():
            return part
    return ""


def visible(raw: str) -> str:
    """The raw line as displayed: no newline, no ANSI codes, last carriage-return segment."""
    return last_segment(strip_ansi(raw.rstrip("\n")))


_JSON_START = re.compile(r'\{\s*"')


def _json_message(text: str) -> str | None:
    """A JSON record: vLLM's optional JSON logging (python-json-logger: ``message`` and
    ``exc_info``), docker's json-file driver (``log``), or an API error body printed by a
    client (``{"object":"error","message":...,"type":...}`` / ``{"error":{"message":...}}``),
    which becomes ``<type>: <message>`` so it reads as the exception it reports."""
    if '"message"' not in text and '"log"' not in text:
        return None
    m = _JSON_START.search(text)
    if m is None:
        return None
    try:
        obj, _end = json.JSONDecoder().raw_decode(text, m.start())
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        obj = {"object": "error", **err}
    msg = obj.get("message")
    if not isinstance(msg, str):
        log = obj.get("log")
        return log.rstrip("\n") if isinstance(log, str) and m.start() == 0 else None
    if obj.get("object") == "error" or isinstance(err, dict):
        kind = obj.get("type")
        name = kind if isinstance(kind, str) and re.fullmatch(r"[A-Za-z_]\w*", kind) else "Error"
        if not name[0].isupper():
            name = "".join(p.capitalize() for p in name.split("_")) or "Error"
        if not re.search(r"(?:Error|Exception)$", name):
            name += "Error"
        return f"{name}: {msg}"
    if m.start() != 0:
        return None
    exc = obj.get("exc_info")
    if isinstance(exc, str) and exc:
        msg = f"{msg}\n{exc}"
    return msg


def strip_prefixes(text: str) -> Normalized:
    """Apply :data:`SHAPES` repeatedly to an already visible line."""
    proc: str | None = None
    level: str | None = None
    level_shape: str | None = None
    closer = ""
    for _ in range(_MAX_ROUNDS):
        before = text
        for pat in _OUTER:
            m = pat.match(text)
            if m:
                if pat is _MARKDOWN:
                    closer = m.group("md")
                text = text[m.end() :]
        for shape in _PROC_LEVEL:
            m = shape.pattern.match(text)
            if m is None:
                continue
            groups = m.groupdict()
            if shape.kind == "proc":
                proc = groups.get("proc") or f"pid{groups.get('pid')}"
            elif groups.get("level"):
                level = _LEVEL_WORDS.get(groups["level"].upper(), groups["level"].upper())
                level_shape = shape.name
            text = text[m.end() :]
        if text == before:
            break
    if closer and text.rstrip().endswith(closer):
        text = text.rstrip()[: -len(closer)]
    return Normalized(text, proc, level, level_shape)


def normalize(raw: str) -> Normalized:
    """Strip prefixes from one physical (or unfolded) line."""
    text = visible(raw)
    if _CONTROL.search(text):
        text = _CONTROL.sub("", text)
    if "m" in text and "[" in text:
        text = _ORPHAN_SGR.sub("", text)
    if text.endswith("^M"):
        text = _CARET_M.sub("", text)
    if "#0" in text:
        text = _SYSLOG_ESC.sub("", text)
    if "^[" in text:
        text = _CARET_ESC.sub("", text)
    if text and text[-1] in "│┃║ ":
        text = _BOX_RIGHT.sub("", text)
    js = _json_message(text)
    if js is not None:
        text = js
    norm = strip_prefixes(text)
    text = norm.text
    if "repeated" in text:
        text = _RAY_REPEAT.sub("", text)
    return Normalized(text.rstrip(), norm.proc, norm.level, norm.level_shape)


# The start of a new log record (never the continuation of a line a terminal folded).
_RECORD_START = re.compile(
    r"\s*(?:>\s+)?(?:\([\w.:\-]+(?:\s(?:TP|DP|PP|EP)\d+\w*)?(?:,?\s+\w+=[^,()\s]+)*,?\s+pid=\d+|\(pid=\d+"
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[\s:]"
    r"|\d{4}-\d\d-\d\d[T ]\d|\[\d{4}-\d\d-\d\d|Traceback \(|File \"|\[fleet\] |\[rank\d+\]:"
    r"|\[[DIWECF](?:\d{4} |\s)[^\]]*\]"
    r"|(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b:)"
)


def looks_like_record_start(text: str) -> bool:
    """Does ``text`` start a new log record (after any collector/CI/quote prefixes)?"""
    if _RECORD_START.match(text) is not None:
        return True
    for _ in range(4):
        before = text
        for pat in _OUTER:
            m = pat.match(text)
            if m and m.end():
                text = text[m.end() :]
        if text == before:
            return False
        if _RECORD_START.match(text) is not None:
            return True
    return False


def fold_width(lines: list[str], *, min_width: int = 40) -> int | None:
    """The terminal width a log was folded at, if it looks folded.

    A log copied from a terminal has its long lines cut at exactly the terminal width W:
    no line is longer than W, many are exactly W long, and those are mostly followed by a
    line that does not start a new record (the rest of the folded message). Identical
    full-length records (a repeated metrics line) do not qualify.
    """
    if len(lines) < 2:
        return None
    counts: Counter[int] = Counter(len(x) for x in lines if len(x) >= min_width)
    if not counts:
        return None
    width = max(counts)
    hits = counts[width]
    if hits < 3 or hits < 0.05 * len(lines):
        return None
    if len({x for x in lines if len(x) == width}) < 3:
        return None  # one record repeated (a metrics line), not text cut at a width
    continued = sum(
        1
        for a, b in itertools.pairwise(lines)
        if len(a) == width and b and not looks_like_record_start(b)
    )
    return width if continued >= 3 and continued * 3 >= hits else None


_TB_HEADER = "Traceback (most recent call last)"
_CARETS = re.compile(r"(?:^|\s)[\^~]{4,}\s*$")
_STAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?|\b\d\d-\d\d \d\d:\d\d:\d\d\b")


def _is_frame(line: str) -> bool:
    return 'File "' in line and ", line " in line


def newest_first(lines: list[str]) -> bool:
    """Was this log printed newest line first (a Kubernetes log viewer, a reversed paste)?

    In Python's order a traceback header is followed by its first frame, a frame by its
    source line and then the caret line; read upside down the header comes after the
    frames and a caret line right after a frame. Time stamps that only go down count too.
    Cheap: only lines holding a header, a frame, carets or a time stamp are looked at."""
    lines = [x for x in lines if x.strip()]  # a double-spaced paste
    normal = reverse = 0
    n = len(lines)
    for i, line in enumerate(lines):
        if _TB_HEADER in line:
            nxt = lines[i + 1] if i + 1 < n else ""
            prv = lines[i - 1] if i else ""
            if _is_frame(nxt):
                normal += 1
            elif _is_frame(prv) or _CARETS.search(prv) or (i > 1 and _is_frame(lines[i - 2])):
                reverse += 1
        elif _is_frame(line):
            if (i + 1 < n and _CARETS.search(lines[i + 1])) or (
                i > 1 and _CARETS.search(lines[i - 2])
            ):
                reverse += 1
            elif i + 2 < n and _CARETS.search(lines[i + 2]):
                normal += 1
    stamps = [m.group(0) for m in map(_STAMP.search, lines) if m is not None]
    ups = downs = 0
    for a, b in itertools.pairwise(stamps):
        if b > a:
            ups += 1
        elif b < a:
            downs += 1
    if downs >= 3 and downs > 3 * ups:
        reverse += 2
    elif ups >= 3 and ups > 3 * downs:
        normal += 2
    return reverse >= 2 and reverse > normal

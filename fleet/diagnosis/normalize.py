"""Line normalisation: strip what terminals, CI systems and vLLM's logger put around a message.

A raw line such as::

    2025-09-28T15:47:24.1Z (EngineCore_DP0 pid=17374) \x1b[1;31mERROR\x1b[0m 09-28 15:47:24 \
        [core.py:718] ValueError: ...

becomes ``ValueError: ...`` with ``proc="EngineCore_DP0"`` and ``level="ERROR"``. Traceback
lines keep their indentation (``  File ...``), which the engine relies on.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass

# ANSI/VT100: CSI sequences, OSC (title, hyperlinks), and two-character escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

# Prefixes added by CI systems, containers and log collectors (applied repeatedly).
_OUTER_PREFIXES: tuple[re.Pattern[str], ...] = (
    # GitHub Actions / ISO timestamps: 2025-09-28T15:47:24.1234567Z
    re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),
    # Buildkite / generic bracketed timestamps: [2025-09-28 15:47:24] or [2025-09-28T15:47:24Z]
    re.compile(r"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]\s?"),
    # plain "2025-09-28 15:47:24,123 " timestamps
    re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s+"),
    # CI line numbers copied from a web log view: "  123 | text", "123│text", "123\ttext"
    re.compile(r"\s{0,6}\d{1,7}\s?[|│]\s?"),
    re.compile(r"\d{1,7}\t"),
    # syslog / journald: "Sep 28 15:47:24 host vllm[1234]: "
    re.compile(r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@/\-]+(?:\[\d+\])?: "),
    # docker compose "vllm-1  | ", kubectl --prefix "[pod/name/container] "
    re.compile(r"[\w.\-]+(?:[-_]\d+)?\s+\| "),
    re.compile(r"\[pod/[^\]\s]+\]\s"),
    # torch's "[rank0]:" prefix
    re.compile(r"\[rank\d+\]:"),
)

# vLLM process prefixes: "(EngineCore_DP0 pid=123) ", "(Worker_TP3 pid=9)", Ray's
# "(RayWorkerWrapper pid=77, ip=10.0.0.2)", "(pid=77)", "(raylet, ip=10.0.0.2)".
_PROC = re.compile(
    r"\((?:(?P<proc>[A-Za-z_][\w.\-]*(?:::[\w.\-]+)?)\s)?pid=(?P<pid>\d+)(?:,\s*ip=[^)\s]*)?\)\s?"
    r"|\((?P<rayproc>raylet|gcs_server|autoscaler|monitor|dashboard\w*),\s*ip=[^)\s]*\)\s?"
)

# Level/time/file: vLLM "ERROR 09-28 15:47:24 [core.py:718] ", older "INFO 10-12 00:26:58
# launcher.py:27] ", DEBUG paths "[model_executor/.../fp8_utils.py:12] "; uvicorn "ERROR:    ";
# Python's default "ERROR:root:".
_LEVEL = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s+"
    r"(?:\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s+)?(?:\[[^\]\s]+:\d+\]|[\w.\-/]+:\d+\])\s?"
    r"|(?P<level2>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?:[\w.]+:|\s+)"
)
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")


@dataclass(frozen=True)
class Normalized:
    text: str
    proc: str | None = None
    level: str | None = None


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


def _json_message(text: str) -> str | None:
    """vLLM's optional JSON logging (python-json-logger): take the message (and exc_info)."""
    if not (text.startswith("{") and '"message"' in text):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("message"), str):
        return None
    msg: str = obj["message"]
    exc = obj.get("exc_info")
    if isinstance(exc, str) and exc:
        msg = f"{msg}\n{exc}"
    return msg


def normalize(raw: str) -> Normalized:
    """Strip prefixes from one physical (or unfolded) line."""
    text = visible(raw)
    if _CONTROL.search(text):
        text = _CONTROL.sub("", text)
    js = _json_message(text)
    if js is not None:
        text = js
    proc: str | None = None
    level: str | None = None
    for _ in range(6):
        before = text
        for pat in _OUTER_PREFIXES:
            m = pat.match(text)
            if m:
                text = text[m.end() :]
        m = _PROC.match(text)
        if m:
            proc = m.group("proc") or m.group("rayproc") or f"pid{m.group('pid')}"
            text = text[m.end() :]
        m = _LEVEL.match(text)
        if m:
            level = m.group("level") or m.group("level2")
            text = text[m.end() :]
        if text == before:
            break
    if "repeated" in text:
        text = _RAY_REPEAT.sub("", text)
    return Normalized(text.rstrip(), proc, level)


# The start of a new log record (never the continuation of a line a terminal folded).
_RECORD_START = re.compile(
    r"\s*(?:\([\w.\-]+ pid=\d+|\(pid=\d+|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[\s:]"
    r"|\d{4}-\d\d-\d\d[T ]\d|\[\d{4}-\d\d-\d\d|Traceback \(|File \"|\[fleet\] "
    r"|(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b:)"
)


def looks_like_record_start(text: str) -> bool:
    return _RECORD_START.match(text) is not None


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
    continued = sum(
        1
        for a, b in itertools.pairwise(lines)
        if len(a) == width and b and not looks_like_record_start(b)
    )
    return width if continued >= 3 and continued * 3 >= hits else None

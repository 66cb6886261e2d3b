"""Read the installed vLLM source on hosts: ``sed -n`` (show) and ``grep -rn`` (grep).

Each request is ONE on-host call (``fleet/onhost/source.py``) per host: it finds the vLLM
package directory with the host's Python (without importing vLLM), resolves the requested
path there, refuses it unless it stays inside that directory (exit 2 here), and then runs
the real ``sed``/``grep`` with a time and output limit, passing their output through after
its answer. Input validation and the output parsers are pure and unit-tested.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.errors import OperationFailed, UsageError
from fleet.onhost.client import HostRefusal, RawAnswer, run_raw

if TYPE_CHECKING:
    from fleet.transport import Runner

SOURCE_TIMEOUT = 120.0
TIME_LIMIT_MARGIN = 10.0  # the tool on the host stops this much before fleet gives up
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000_000
MAX_LINE = 2**31 - 1  # FILE:A-B beyond this is bad input (sed's addresses would wrap)
SCRIPT = "source"

_RANGE = re.compile(r"^(?P<start>\d+)(?:(?P<dash>-)(?P<end>\d*))?$")
_RANGE_LIKE = re.compile(r"^[\d\s,-]*$")  # what follows the last ':' is meant as a range


class PathEscapesTree(UsageError):
    """A path that resolves (on the host) outside the vLLM package directory (exit 2)."""

    code = "path-escapes-tree"


@dataclass(frozen=True)
class FileRange:
    """``FILE[:A-B]``: a path relative to the vLLM package dir and an optional line range."""

    path: str
    start: int = 1
    end: int | None = None  # None: to the end of the file

    @property
    def label(self) -> str:
        if self.start == 1 and self.end is None:
            return self.path
        return f"{self.path}:{self.start}-{'' if self.end is None else self.end}"


@dataclass
class ShownFile:
    vllm_dir: str
    file: str  # absolute path on the host
    path: str  # relative to the vLLM dir
    total_lines: int
    start: int
    lines: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class GrepMatch:
    path: str  # relative to the vLLM dir
    line: int
    text: str


@dataclass
class GrepResult:
    vllm_dir: str
    matches: list[GrepMatch] = field(default_factory=list)
    truncated: bool = False
    warnings: list[str] = field(default_factory=list)


# -- input validation (local, before any connection) ------------------------------------


def check_relative(path: str, what: str = "path") -> str:
    """A path relative to the vLLM package directory; absolute paths and ``..`` refused."""
    if "\0" in path or "\n" in path:
        raise UsageError(f"{what} {path!r} contains a NUL or newline character")
    if path.startswith("/") or path.startswith("~"):
        raise UsageError(
            f"{what} {path!r} is outside the vLLM tree: give it relative to the vLLM package "
            "directory (e.g. model_executor/models/deepseek_v2.py)"
        )
    if ".." in path.split("/"):
        raise UsageError(f"{what} {path!r} leaves the vLLM tree ('..' is not allowed)")
    return path


def parse_file_spec(text: str) -> FileRange:
    """``FILE``, ``FILE:A``, ``FILE:A-B`` or ``FILE:A-`` (lines numbered from 1).

    A ``:`` followed by something other than digits and dashes is part of the name."""
    path, start, end = text, 1, None
    head, sep, tail = text.rpartition(":")
    if sep and _RANGE_LIKE.match(tail):
        match = _RANGE.match(tail)
        if match is None:
            raise UsageError(
                f"bad line range {tail!r} in {text!r}: use FILE:A-B, FILE:A or FILE:A-"
            )
        path = head
        start = int(match["start"])
        if match["dash"] is None:
            end = start
        elif match["end"]:
            end = int(match["end"])
        if start < 1:
            raise UsageError(f"bad line range {tail!r} in {text!r}: lines are numbered from 1")
        if max(start, end or 0) > MAX_LINE:
            raise UsageError(f"bad line range in {text!r}: line numbers go up to {MAX_LINE}")
        if end is not None and end < start:
            raise UsageError(f"bad line range {tail!r} in {text!r}: {end} is before {start}")
    if not path:
        raise UsageError("no file given")
    return FileRange(check_relative(path, "file"), start, end)


def check_regex(regex: str, *, fixed: bool = False) -> str:
    """Refuse a regex GNU grep would reject (checked with the local grep, if any)."""
    if not regex:
        raise UsageError("empty regex")
    if "\n" in regex or "\0" in regex:
        raise UsageError("the regex contains a newline or NUL character")
    if fixed:
        return regex
    try:
        proc = subprocess.run(
            ["grep", "-E", "-e", regex, "/dev/null"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return regex  # no local grep: the host's grep will judge
    if proc.returncode == 2:
        reason = (proc.stderr.strip().splitlines() or ["invalid"])[-1]
        reason = reason.removeprefix("grep: ")
        raise UsageError(f"invalid regex {regex!r}: {reason}")
    return regex


# -- output parsers (pure) --------------------------------------------------------------


def relative_to(path: str, root: str) -> str:
    if path == root:
        return "."
    prefix = root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def parse_show_output(answer: dict[str, Any], body: bytes, spec: FileRange) -> ShownFile:
    """The on-host answer (dir, file, line count) and the lines ``sed`` printed, numbered
    from ``start``."""
    try:
        vllm_dir, file, total = str(answer["vllm_dir"]), str(answer["file"]), answer["total_lines"]
        total = int(total)
    except (KeyError, TypeError, ValueError):
        raise OperationFailed("unexpected answer from the remote source command") from None
    texts = body.decode("utf-8", errors="replace").split("\n")
    if texts and texts[-1] == "":
        texts.pop()
    lines = [(spec.start + i, text) for i, text in enumerate(texts)]
    return ShownFile(
        vllm_dir=vllm_dir,
        file=file,
        path=relative_to(file, vllm_dir),
        total_lines=total,
        start=spec.start,
        lines=lines,
    )


def parse_grep_output(vllm_dir: str, body: bytes, limit: int | None = DEFAULT_LIMIT) -> GrepResult:
    """``grep -nHZ`` lines: ``path\0line:text``."""
    result = GrepResult(vllm_dir=vllm_dir)
    for raw in body.decode("utf-8", errors="replace").split("\n"):
        if not raw:
            continue
        path, sep, rest = raw.partition("\0")
        number, colon, text = rest.partition(":")
        if not sep or not colon or not number.isascii() or not number.isdigit():
            result.warnings.append(f"unparsed grep line: {raw[:200]!r}")
            continue
        result.matches.append(GrepMatch(relative_to(path, vllm_dir), int(number), text))
    if limit and len(result.matches) > limit:
        result.matches = result.matches[:limit]
        result.truncated = True
    return result


EXIT_TIME_LIMIT = 124
EXIT_OUTPUT_LIMIT = 123  # the tool's output passed the on-host cap (fleet/onhost/source.py)


def _call(conn: Runner, request: dict[str, Any], what: str, timeout: float) -> RawAnswer:
    """One on-host call; a refusal becomes the error the CLI reports (exit 2 for a path
    leaving the tree), a tool stopped at its time limit a failure."""
    request["time_limit"] = max(1.0, timeout - TIME_LIMIT_MARGIN)
    host = conn.host.name
    try:
        raw = run_raw(conn, SCRIPT, request, timeout=timeout)
    except HostRefusal as exc:
        if exc.code == "path-escapes-tree":
            raise PathEscapesTree(
                f"{host}: {what} resolves outside the vLLM tree; refused"
            ) from None
        raise
    if raw.exit_code == EXIT_OUTPUT_LIMIT:
        raise OperationFailed(
            f"{host}: {request['op']} of {what} printed more than the host passes on "
            "(32 MiB); stopped",
            hint="narrow it: a line range (FILE:A-B), a path, --include or --limit",
        )
    if raw.exit_code == EXIT_TIME_LIMIT:
        raise OperationFailed(
            f"{host}: {request['op']} of {what} stopped after {request['time_limit']:.0f}s "
            "on the host",
            code="command-timeout",
        )
    return raw


# -- remote effects ---------------------------------------------------------------------


def show_file(conn: Runner, spec: FileRange, *, timeout: float = SOURCE_TIMEOUT) -> ShownFile:
    """``sed -n A,Bp`` of a file of the host's vLLM tree (one command)."""
    check_relative(spec.path, "file")
    request = {"op": "show", "path": spec.path, "start": spec.start, "end": spec.end}
    raw = _call(conn, request, spec.path, timeout)
    if raw.exit_code != 0:
        detail = (raw.stderr.strip().splitlines() or [""])[-1]
        raise OperationFailed(f"{conn.host.name}: sed exited {raw.exit_code}: {detail}")
    return parse_show_output(raw.result, raw.body, spec)


def grep_tree(
    conn: Runner,
    regex: str,
    path: str = ".",
    *,
    ignore_case: bool = False,
    fixed: bool = False,
    max_count: int | None = None,
    includes: Sequence[str] = (),
    limit: int | None = DEFAULT_LIMIT,
    timeout: float = SOURCE_TIMEOUT,
) -> GrepResult:
    """``grep -rn`` over the host's vLLM tree (or a path in it), one command."""
    check_relative(path, "path")
    request: dict[str, Any] = {
        "op": "grep",
        "path": path,
        "regex": regex,
        "ignore_case": ignore_case,
        "fixed": fixed,
        "max_count": max_count,
        "includes": list(includes),
        "limit": limit,
    }
    raw = _call(conn, request, path, timeout)
    result = parse_grep_output(str(raw.result.get("vllm_dir", "")), raw.body, limit)
    errors = [line for line in raw.stderr.splitlines() if line.strip()]
    if raw.exit_code > 2 or (errors and not result.matches and raw.exit_code == 2):
        detail = errors[-1] if errors else f"grep exited {raw.exit_code}"
        raise OperationFailed(f"{conn.host.name}: grep failed: {detail}")
    result.warnings += errors
    return result

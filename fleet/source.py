"""Read the installed vLLM source on hosts: ``sed -n`` (show) and ``grep -rn`` (grep).

Each request is ONE shell command per host that finds the vLLM package directory with the
host's Python (``importlib.util.find_spec``, which does not import vLLM), resolves the
requested path with ``realpath`` on the host, refuses it unless it stays inside that
directory, and then runs ``sed``/``grep``. Every user-supplied word is ``shlex.quote``-d;
the command builders and output parsers are pure and unit-tested.

Remote protocol: the command prints ``<vllm dir>\\0`` (and for ``show`` also
``<file>\\0<line count>\\0``) before the tool's own output, and exits with one of the
``EXIT_*`` codes below when it refuses.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleet.errors import FleetError, OperationFailed, UsageError
from fleet.facts.gather import python_word

if TYPE_CHECKING:
    from fleet.transport import HostConnection, Result

EXIT_NO_VLLM = 90
EXIT_NOT_FOUND = 91
EXIT_ESCAPES = 92
EXIT_NOT_A_FILE = 93
SOURCE_TIMEOUT = 120.0
DEFAULT_LIMIT = 1000

# Printed on the host: the real path of the vLLM package directory, found without
# importing vLLM (find_spec of a top-level name does not execute the package).
FIND_VLLM = "; ".join(
    (
        "import importlib.util as u, os, sys",
        # only the installed environment counts, not the directory the command runs in
        'sys.path[:] = [p for p in sys.path if p not in ("", ".")]',
        's = u.find_spec("vllm")',
        "l = list(s.submodule_search_locations or []) if s else []",
        'l or sys.exit("vLLM is not installed for " + sys.executable)',
        "sys.stdout.write(os.path.realpath(l[0]))",
    )
)

_RANGE = re.compile(r"^(?P<start>\d+)(?:(?P<dash>-)(?P<end>\d*))?$")
_RANGE_LIKE = re.compile(r"^[\d\s,-]*$")  # what follows the last ':' is meant as a range


class PathEscapesTree(UsageError):
    """A path that resolves (on the host) outside the vLLM package directory (exit 2)."""


@dataclass(frozen=True)
class FileSpec:
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


def parse_file_spec(text: str) -> FileSpec:
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
        if end is not None and end < start:
            raise UsageError(f"bad line range {tail!r} in {text!r}: {end} is before {start}")
    if not path:
        raise UsageError("no file given")
    return FileSpec(check_relative(path, "file"), start, end)


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


# -- command builders (pure) ------------------------------------------------------------


def _locate(python: str, rel: str) -> str:
    """Shell text: ``d`` = real vLLM dir, ``f`` = real path of ``rel`` inside it (or exit)."""
    return (
        f"d=$({python_word(python)} -c {shlex.quote(FIND_VLLM)}) || exit {EXIT_NO_VLLM}; "
        f'[ -n "$d" ] && cd "$d" || exit {EXIT_NO_VLLM}; '
        f"f=$(realpath -e -- {shlex.quote(rel)} 2>/dev/null) || exit {EXIT_NOT_FOUND}; "
        f'case "$f" in "$d"|"$d"/*) ;; *) exit {EXIT_ESCAPES} ;; esac; '
    )


_SH_SPECIAL = re.compile(r"([\\'!])")


def shell_word(text: str) -> str:
    """``text`` as ONE word for every common login shell: sh, bash, zsh, fish and csh.

    Runs of ordinary characters go in single quotes; each backslash, single quote and
    ``!`` is written unquoted, escaped by a backslash: inside single quotes fish reads two
    backslashes as one and csh expands ``!`` (history), while outside quotes every shell
    reads an escaped character the same way. csh cannot quote a newline: refused."""
    if "\n" in text or "\0" in text:
        raise UsageError(f"a remote command cannot contain a newline or NUL: {text[:80]!r}")
    if not text:
        return "''"
    out = []
    for piece in _SH_SPECIAL.split(text):
        if piece in ("\\", "'", "!"):
            out.append("\\" + piece)
        elif piece:
            out.append("'" + piece + "'")
    return "".join(out)


def sh_command(script: str) -> str:
    """``sh -c <script>``: run a one-line POSIX sh ``script`` whatever the user's login
    shell is (it only has to pass one word to ``sh``, see :func:`shell_word`)."""
    return "sh -c " + shell_word(script)


def show_command(python: str, spec: FileSpec) -> str:
    """One command: locate, refuse escapes, print dir/file/line count, then ``sed -n``."""
    check_relative(spec.path, "file")
    end = "$" if spec.end is None else str(spec.end)
    sed = f"{spec.start},{end}p" + ("" if spec.end is None else f";{spec.end}q")
    script = _locate(python, spec.path) + (
        f'[ -f "$f" ] || exit {EXIT_NOT_A_FILE}; '
        'n=$(wc -l < "$f") || exit 1; '
        "printf '%s\\0%s\\0%s\\0' \"$d\" \"$f\" \"$n\"; "
        f'exec sed -n {shlex.quote(sed)} "$f"'
    )
    return sh_command(script)


def grep_command(
    python: str,
    regex: str,
    path: str = ".",
    *,
    ignore_case: bool = False,
    fixed: bool = False,
    max_count: int | None = None,
    includes: Sequence[str] = (),
    limit: int | None = DEFAULT_LIMIT,
) -> str:
    """One command: locate, refuse escapes, print the dir, then ``grep -rn`` over it.

    ``limit`` caps the lines sent back (one more is read to tell that it was cut)."""
    check_relative(path, "path")
    argv = ["grep", "-rnHIZ", "-F" if fixed else "-E", "--exclude-dir=__pycache__"]
    if ignore_case:
        argv.append("-i")
    if max_count is not None:
        argv.append(f"--max-count={int(max_count)}")
    argv += [f"--include={glob}" for glob in includes]
    argv += ["-e", regex, "--"]
    grep = shlex.join(argv) + ' "$f"'
    if limit:
        grep += f" | head -n {int(limit) + 1}"
    grep += ' || [ "$?" -le 2 ]'  # grep: 1 = no match, 2 = some file unreadable
    script = _locate(python, path) + "printf '%s\\0' \"$d\"; " + grep
    return sh_command(script)


# -- output parsers (pure) --------------------------------------------------------------


def relative_to(path: str, root: str) -> str:
    if path == root:
        return "."
    prefix = root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def refusal(code: int, what: str, host: str, stderr: str = "") -> FleetError | None:
    """The error for one of the command's refusal exit codes (None for other codes)."""
    if code == EXIT_ESCAPES:
        return PathEscapesTree(f"{host}: {what} resolves outside the vLLM tree; refused")
    if code == EXIT_NOT_FOUND:
        return OperationFailed(f"{host}: {what}: no such file or directory in the vLLM tree")
    if code == EXIT_NOT_A_FILE:
        return OperationFailed(f"{host}: {what} is not a regular file")
    if code == EXIT_NO_VLLM:
        detail = (stderr.strip().splitlines() or ["vLLM not found"])[-1]
        return OperationFailed(f"{host}: cannot locate vLLM: {detail}")
    return None


def parse_show_output(stdout: str, spec: FileSpec) -> ShownFile:
    """``dir\\0file\\0count\\0`` then the lines ``sed`` printed, numbered from ``start``."""
    fields = stdout.split("\0", 3)
    if len(fields) != 4:
        raise OperationFailed("unexpected output from the remote source command")
    vllm_dir, file, count, body = fields
    try:
        total = int(count.strip())
    except ValueError:
        raise OperationFailed(f"unexpected line count {count!r} from wc") from None
    texts = body.split("\n")
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


def parse_grep_output(stdout: str, limit: int | None = DEFAULT_LIMIT) -> GrepResult:
    """``dir\\0`` then ``grep -nHZ`` lines: ``path\\0line:text``."""
    vllm_dir, sep, body = stdout.partition("\0")
    if not sep:
        raise OperationFailed("unexpected output from the remote grep command")
    result = GrepResult(vllm_dir=vllm_dir)
    for raw in body.split("\n"):
        if not raw:
            continue
        path, sep, rest = raw.partition("\0")
        number, colon, text = rest.partition(":")
        if not sep or not colon or not number.isdigit():
            result.warnings.append(f"unparsed grep line: {raw[:200]!r}")
            continue
        result.matches.append(GrepMatch(relative_to(path, vllm_dir), int(number), text))
    if limit and len(result.matches) > limit:
        result.matches = result.matches[:limit]
        result.truncated = True
    return result


def _check(res: Result, what: str, host: str) -> None:
    error = refusal(res.exit_code, what, host, res.stderr)
    if error is not None:
        raise error


# -- remote effects ---------------------------------------------------------------------


def show_file(
    conn: HostConnection, spec: FileSpec, *, timeout: float = SOURCE_TIMEOUT
) -> ShownFile:
    """``sed -n A,Bp`` of a file of the host's vLLM tree (one command)."""
    res = conn.run(show_command(conn.host.python, spec), timeout=timeout)
    _check(res, spec.path, conn.host.name)
    if not res.ok:
        res.check("source show")
    return parse_show_output(res.stdout, spec)


def grep_tree(
    conn: HostConnection,
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
    cmd = grep_command(
        conn.host.python, regex, path, ignore_case=ignore_case, fixed=fixed,
        max_count=max_count, includes=includes, limit=limit,
    )
    res = conn.run(cmd, timeout=timeout)
    _check(res, path, conn.host.name)
    if not res.ok:
        res.check("source grep")
    result = parse_grep_output(res.stdout, limit)
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    if errors and not result.matches:
        raise OperationFailed(f"{conn.host.name}: grep failed: {errors[-1]}")
    result.warnings += errors
    return result

# fleet source script: runs ON THE HOST in a bundle (see _common.py).
#
# `fleet source show|grep`: locate the installed vLLM (never importing it), resolve the
# requested path inside that package directory (symlinks followed; a path that leaves the
# tree is refused), then run the real `sed -n` or `grep -rn` on it and pass their output
# through after the answer. The tool runs as a child with a time limit and an output
# limit: it is killed when either is reached, or when fleet goes away (the runtime's
# watchdog sees stdin end, or a write to a closed connection fails), so no remote process
# outlives the command. Special files (FIFOs,
# devices, sockets) are never read: refused as a target, skipped by grep (-D skip).
import errno
import os
import select
import signal
import stat
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from fleet.onhost._common import CHILDREN, Refused, Then, inside, require_vllm, start_group

EXIT_TIME_LIMIT = 124
EXIT_OUTPUT_LIMIT = 123
CHUNK = 65536
MAX_OUTPUT = 32 * 1024 * 1024  # bytes of sed/grep output passed through (a huge line...)
TOOL_MEMORY = 1 << 30  # address space of sed/grep: a multi-GiB line fails, the host does not


def _resolve(request: Dict[str, Any], want_file: bool) -> Dict[str, Any]:
    root = require_vllm()
    rel = str(request.get("path") or ".")
    path = root if rel in (".", "") else inside(root, rel)
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        raise Refused(
            rel + ": no such file or directory in the vLLM tree", "path-not-found"
        ) from None
    if want_file and not stat.S_ISREG(st.st_mode):
        raise Refused(rel + " is not a regular file", "not-a-file")
    if not want_file and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise Refused(rel + " is not a regular file or directory", "not-a-file")
    return {"vllm_dir": root, "file": real}


def _count_lines(path: str) -> Tuple[int, int]:
    """(newlines, length of the longest line) of a file, read in blocks."""
    n = 0
    longest = 0
    current = 0  # length of the line running across blocks
    with open(path, "rb") as fh:
        while True:
            block = fh.read(1 << 20)
            if not block:
                return n, max(longest, current)
            count = block.count(b"\n")
            if not count:
                current += len(block)
                continue
            parts = block.split(b"\n")
            longest = max(longest, current + len(parts[0]), max(len(x) for x in parts[:-1]))
            current = len(parts[-1])
            n += count


def _nth_newline(data: bytes, n: int) -> int:
    """The offset of the n-th (1-based) newline in data (n >= 1 and data has that many)."""
    pos = -1
    for _ in range(n):
        pos = data.find(b"\n", pos + 1)
    return pos


def _pass_through(argv: List[str], cwd: str, limit_s: float, max_lines: Optional[int]) -> int:
    """Run argv, copy its stdout to ours (at most max_lines lines and MAX_OUTPUT bytes),
    end it at the time limit; the tool's memory is limited (TOOL_MEMORY)."""
    with _memory_limit(TOOL_MEMORY):
        proc = start_group(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    deadline = time.monotonic() + limit_s
    out = sys.stdout.buffer
    lines = 0
    sent = 0
    status: Optional[int] = None  # set when we stop the tool ourselves
    try:
        fd = proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                sys.stderr.write("fleet: %s stopped after %.0fs\n" % (argv[0], limit_s))
                status = EXIT_TIME_LIMIT
                break
            ready, _w, _x = select.select([fd], [], [], left)
            if not ready:
                continue
            data = os.read(fd, CHUNK)
            if not data:
                break
            sent += len(data)
            if sent > MAX_OUTPUT:
                sys.stderr.write(
                    "fleet: %s output over %d bytes; stopped\n" % (argv[0], MAX_OUTPUT)
                )
                status = EXIT_OUTPUT_LIMIT
                break
            if max_lines is not None and lines + data.count(b"\n") >= max_lines:
                out.write(data[: _nth_newline(data, max_lines - lines) + 1])
                status = 0
                break
            lines += data.count(b"\n")
            out.write(data)
        out.flush()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        status = 141  # fleet went away
    except SystemExit:
        status = 143  # fleet went away (the watchdog): stop the tool at once
        raise
    finally:
        if status is None:  # the tool closed its output: let it finish
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        code = proc.wait()
        proc.stdout.close()
        CHILDREN.remove(proc)
    return code if status is None else status


class _memory_limit:
    """RLIMIT_AS lowered to `limit` while a child is started (it inherits it), then back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.saved: Optional[Any] = None

    def __enter__(self) -> None:
        try:
            import resource

            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            want = self.limit
            if hard != resource.RLIM_INFINITY:
                want = min(want, hard)
            if soft == resource.RLIM_INFINITY or soft > want:
                resource.setrlimit(resource.RLIMIT_AS, (want, hard))
                self.saved = (resource, soft, hard)
        except (ImportError, ValueError, OSError):
            self.saved = None

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            resource, soft, hard = self.saved
            try:
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
            except (ValueError, OSError):
                pass


def op_show(request: Dict[str, Any]) -> Any:
    found = _resolve(request, want_file=True)
    start = int(request.get("start") or 1)
    end = request.get("end")
    total, longest = _count_lines(found["file"])
    if longest > MAX_OUTPUT:
        raise Refused(
            "%s has a line of %d bytes; fleet shows lines up to %d bytes"
            % (request.get("path"), longest, MAX_OUTPUT),
            "not-a-file",
        )
    script = "%d,%sp" % (start, "$" if end is None else int(end))
    if end is not None:
        script += ";%dq" % int(end)
    argv = ["sed", "-n", script, found["file"]]
    limit = float(request.get("time_limit") or 60)
    result = dict(found, total_lines=total)
    return Then(result, lambda: _pass_through(argv, found["vllm_dir"], limit, None))


def op_grep(request: Dict[str, Any]) -> Any:
    found = _resolve(request, want_file=False)
    argv = ["grep", "-rnHIZ", "-D", "skip", "--exclude-dir=__pycache__"]
    argv.append("-F" if request.get("fixed") else "-E")
    if request.get("ignore_case"):
        argv.append("-i")
    if request.get("max_count"):
        argv.append("--max-count=%d" % int(request["max_count"]))
    argv += ["--include=" + str(g) for g in request.get("includes") or []]
    argv += ["-e", str(request["regex"]), "--", found["file"]]
    limit = request.get("limit")
    max_lines = int(limit) + 1 if limit else None  # one more tells that it was cut
    time_limit = float(request.get("time_limit") or 60)
    return Then(found, lambda: _pass_through(argv, found["vllm_dir"], time_limit, max_lines))


OPS = {"show": op_show, "grep": op_grep}

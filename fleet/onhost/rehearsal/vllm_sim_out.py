# fleet on-host module: how the rehearsal vLLM writes, byte for byte as vLLM does.
#
# Part of the simulated `vllm serve` (see vllm_sim.py). Python 3.8+, standard library only.
#
# - log records: `LEVEL MM-DD HH:MM:SS [file.py:line] msg`, multi-line records with
#   vLLM's NewLineFormatter (`\n` -> `\r\n` + the header; vllm/logging_utils/formatter.py),
#   the logger on stdout;
# - process prefixes: vLLM's `_add_prefix` wrapper of `write` (vllm/utils/system_utils.py),
#   one prefix per `\n` before the next character, on stdout AND stderr, nested when the
#   wrapper is applied twice (0.17's `(Worker pid=W) (Worker_TP0 pid=W)`);
# - tqdm: `format_meter`, the status printer (`\r` + text + padding), the exponential
#   moving average of the rate (smoothing 0.3), `mininterval` 0.1 s, and `close()`
#   (the final state again with the overall rate, then `\n`);
# - tracebacks as CPython prints them (carets from 3.11 on).
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from fleet.onhost._common import parse_python

CYAN_BOLD = "\033[1;36m"  # vllm/utils/__init__.py (0.10.x)
CYAN = "\033[0;36m"  # vllm/utils/system_utils.py (0.13+)
RESET = "\033[0;0m"
DATE_FORMAT = "%m-%d %H:%M:%S"  # vllm/logger.py _DATE_FORMAT


def record_header(level: str, basename: str, line: int, when: Optional[float] = None) -> str:
    """`%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] ` of vllm/logger.py _FORMAT."""
    stamp = time.strftime(DATE_FORMAT, time.localtime(time.time() if when is None else when))
    return "%s %s [%s:%d] " % (level, stamp, basename, line)


def format_record(level: str, basename: str, line: int, message: str) -> str:
    """A whole record as the StreamHandler writes it (one write, ending in `\\n`)."""
    header = record_header(level, basename, line)
    text = header + message
    if message != "":
        text = text.replace("\n", "\r\n" + header)
    return text + "\n"


def percent_format(fmt: str, args: Any) -> str:
    """`fmt % args` as logging does (`msg % args`); a tuple of the wrong arity or a bad
    conversion falls back to the format followed by the arguments (never raises)."""
    if args is None or args == ():
        return fmt
    try:
        return fmt % args
    except (TypeError, ValueError, KeyError):
        return fmt + " " + " ".join(str(a) for a in (args if isinstance(args, tuple) else (args,)))


class Prefixed:
    """One stream of one process, wrapped like vLLM's `_add_prefix` (once per call of
    `decorate_logs` / `setup_proc_title_and_log_prefix`): `wrap(prefix)` wraps the current
    `write`, so wrapping twice nests as vLLM 0.17 does."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self.write: Callable[[str], None] = sink
        self.base = sink

    def wrap(self, prefix: str) -> None:
        inner = self.write
        state = {"start_new_line": True}

        def write_with_prefix(s: str) -> None:
            if not s:
                return
            if state["start_new_line"]:
                inner(prefix)
            idx = 0
            while True:
                next_idx = s.find("\n", idx)
                if next_idx == -1:
                    break
                next_idx += 1
                inner(s[idx:next_idx])
                if next_idx == len(s):
                    state["start_new_line"] = True
                    return
                inner(prefix)
                idx = next_idx
            inner(s[idx:])
            state["start_new_line"] = False

        self.write = write_with_prefix

    def replace_wrappers(self, prefix: str) -> None:
        """vLLM 0.18's fix: re-prefixing wraps the original write, not the wrapped one."""
        self.write = self.base
        self.wrap(prefix)


def prefix_text(name: str, pid: int, colour: Optional[str]) -> str:
    if colour:
        return "%s(%s pid=%d)%s " % (colour, name, pid, RESET)
    return "(%s pid=%d) " % (name, pid)


# ---- tqdm ---------------------------------------------------------------------------

TQDM_UTF = " " + "".join(chr(c) for c in range(0x258F, 0x2587, -1))
TQDM_BARS = 10  # the bar width when tqdm cannot tell the terminal's (not a tty)


def tqdm_interval(seconds: float) -> str:
    mins, s = divmod(int(seconds), 60)
    h, m = divmod(mins, 60)
    if h:
        return f"{h:d}:{m:02d}:{s:02d}"
    return f"{m:02d}:{s:02d}"


def tqdm_bar(frac: float) -> str:
    nsyms = len(TQDM_UTF) - 1
    bar_length, frac_bar_length = divmod(int(frac * TQDM_BARS * nsyms), nsyms)
    res = TQDM_UTF[-1] * bar_length
    if bar_length < TQDM_BARS:
        return res + TQDM_UTF[frac_bar_length] + TQDM_UTF[0] * (TQDM_BARS - bar_length - 1)
    return res


def tqdm_meter(
    n: int, total: int, elapsed: float, desc: str, rate: Optional[float], bar_format: Optional[str]
) -> str:
    """tqdm.format_meter for the arguments vLLM's bars use (no unit scaling)."""
    if rate is None and elapsed:
        rate = n / elapsed
    inv_rate = 1 / rate if rate else None
    rate_noinv_fmt = (f"{rate:5.2f}" if rate else "?") + "it/s"
    rate_inv_fmt = (f"{inv_rate:5.2f}" if inv_rate else "?") + "s/it"
    rate_fmt = rate_inv_fmt if inv_rate and inv_rate > 1 else rate_noinv_fmt
    remaining = (total - n) / rate if rate and total else 0
    remaining_str = tqdm_interval(remaining) if rate else "?"
    elapsed_str = tqdm_interval(elapsed)
    percentage = (n / total * 100) if total else 0.0
    l_bar = (desc + ": " if desc else "") + f"{percentage:3.0f}%|"
    r_bar = f"| {n}/{total} [{elapsed_str}<{remaining_str}, {rate_fmt}]"
    if bar_format:
        return bar_format.format(
            desc=desc,
            percentage=percentage,
            n_fmt=str(n),
            total_fmt=str(total),
            elapsed=elapsed_str,
            remaining=remaining_str,
            rate_fmt=rate_fmt,
            l_bar=l_bar,
            r_bar=r_bar,
            bar=tqdm_bar(n / total if total else 0.0),
        )
    return l_bar + tqdm_bar(n / total if total else 0.0) + r_bar


class TqdmEma:
    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.last = 0.0
        self.calls = 0

    def __call__(self, x: Optional[float] = None) -> float:
        beta = 1 - self.alpha
        if x is not None:
            self.last = self.alpha * x + beta * self.last
            self.calls += 1
        return self.last / (1 - beta**self.calls) if self.calls else self.last


class Tqdm:
    """A tqdm bar writing to `write` (a process's stderr), driven by the caller's clock.

    `mininterval` is tqdm's throttle (0.1 s). The simulator passes 0: in the 40-minute
    load it stands for, a shard takes ~36 s and a CUDA graph ~0.3 s, so tqdm prints every
    update; the compressed load keeps that shape."""

    def __init__(
        self,
        write: Callable[[str], None],
        desc: str,
        total: int,
        bar_format: Optional[str] = None,
        clock: Callable[[], float] = time.monotonic,
        mininterval: float = 0.1,
    ) -> None:
        self.mininterval = mininterval
        self.write = write
        self.desc = desc
        self.total = total
        self.bar_format = bar_format
        self.clock = clock
        self.n = 0
        self.start_t = clock()
        self.last_print_t = self.start_t
        self.last_print_n = 0
        self.ema_dn = TqdmEma()
        self.ema_dt = TqdmEma()
        self.overall = False
        self.last_len = 0
        self.display()

    def rate(self) -> Optional[float]:
        if self.overall:
            return None
        dt = self.ema_dt()
        return self.ema_dn() / dt if dt else None

    def display(self) -> None:
        text = tqdm_meter(
            self.n,
            self.total,
            self.clock() - self.start_t,
            self.desc,
            self.rate(),
            self.bar_format,
        )
        pad = " " * max(self.last_len - len(text), 0)
        self.write("\r" + text + pad)
        self.last_len = len(text)

    def update(self, n: int = 1) -> None:
        self.n += n
        cur_t = self.clock()
        dt = cur_t - self.last_print_t
        if dt >= self.mininterval:
            dn = self.n - self.last_print_n
            if dt and dn:
                self.ema_dn(dn)
                self.ema_dt(dt)
            self.display()
            self.last_print_n = self.n
            self.last_print_t = cur_t

    def close(self) -> None:
        self.overall = True
        self.display()
        self.write("\n")


# ---- tracebacks -----------------------------------------------------------------------


class Frame:
    """One traceback entry: where, the source line and what is highlighted on it."""

    def __init__(
        self, path: str, line: int, func: str, text: str, callee: Optional[str] = None
    ) -> None:
        self.path = path
        self.line = line
        self.func = func
        self.text = text  # the raw source line (indentation kept)
        self.callee = callee  # the function the next frame runs (for carets)


def caret_line(raw: str, callee: Optional[str]) -> Optional[str]:
    """CPython 3.11+'s carets under the call that is executing. 3.11/3.12: `^` under the
    call, omitted when the call is the whole line; 3.13+: `~` under the callee and `^`
    under the arguments, always shown."""
    if sys.version_info < (3, 11) or callee is None:
        return None
    import ast

    stripped = raw.strip()
    try:
        tree = parse_python(stripped)
    except SyntaxError:
        return None
    best = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == callee or callee == "*":
            end = node.end_col_offset or node.col_offset
            if best is None or end - node.col_offset < best[1] - best[0]:
                best = (node.col_offset, end, func.end_col_offset or end)
    if best is None:
        return None
    start, end, func_end = best
    end = min(end, len(stripped))
    if sys.version_info >= (3, 13):
        return "    " + " " * start + "~" * (func_end - start) + "^" * (end - func_end)
    if start == 0 and end >= len(stripped):
        return None
    return "    " + " " * start + "^" * (end - start)


def traceback_text(frames: List[Frame], exception: str) -> str:
    """`Traceback (most recent call last):` ... `Type: message` (no trailing newline)."""
    out = ["Traceback (most recent call last):"]
    for frame in frames:
        out.append('  File "%s", line %d, in %s' % (frame.path, frame.line, frame.func))
        if frame.text.strip():
            out.append("    " + frame.text.strip())
            carets = caret_line(frame.text, frame.callee)
            if carets:
                out.append(carets)
    out.append(exception)
    return "\n".join(out)


# ---- the one writer of a simulated server ---------------------------------------------


class SimWriter:
    """All output of the simulated processes goes through one lock, in order.

    A process's bytes are written by that process (`send(proc, fd, data)`), the prefix
    state lives here. With `number_lines`, every physical line gets ` [seq=N]` before its
    line ending (before a `\\r\\n` pair, or `\\n`), N counting from 1 over all processes."""

    def __init__(self, number_lines: bool = False) -> None:
        self.lock = threading.RLock()
        self.number_lines = number_lines
        self.seq = 0
        self.pending_cr: Dict[Tuple[int, int], bool] = {}

    def numbered(self, key: Tuple[int, int], text: str) -> str:
        if not self.number_lines or "\n" not in text:
            return text
        out: List[str] = []
        start = 0
        while True:
            idx = text.find("\n", start)
            if idx == -1:
                out.append(text[start:])
                break
            chunk = text[start:idx]
            self.seq += 1
            if chunk.endswith("\r"):
                out.append(chunk[:-1] + " [seq=%d]\r\n" % self.seq)
            else:
                out.append(chunk + " [seq=%d]\n" % self.seq)
            start = idx + 1
        return "".join(out)


def write_fd(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`; a closed reader (EPIPE) is ignored."""
    view = memoryview(data)
    while view:
        try:
            done = os.write(fd, view)
        except BrokenPipeError:
            return
        except InterruptedError:  # pragma: no cover - retried by CPython already
            continue
        view = view[done:]

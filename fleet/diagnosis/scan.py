"""Local files at scale: select candidate lines without decoding the whole file.

A healthy vLLM log is almost all INFO lines (per-request and throughput lines). The scanner
works on raw bytes in large chunks: one regex finds every line that does *not* start with an
INFO/DEBUG level (after optional timestamp and process prefixes), a ``find`` per info gate
finds the few INFO lines an ``info: true`` pattern can match, and only those lines plus a
window of context are decoded and fed to the :class:`~fleet.diagnosis.engine.Engine`. The
engine applies the same INFO rule, so the result equals feeding it every line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fleet.diagnosis.catalogue import CompiledCatalogue, load_catalogue
from fleet.diagnosis.engine import FOLD_SAMPLE, Engine, diagnose_numbered
from fleet.diagnosis.models import Diagnosis
from fleet.diagnosis.normalize import fold_width, newest_first, visible

CHUNK = 16 * 1024 * 1024
WINDOW = 3  # context lines kept around each candidate line
MAX_CARRY = 4 * 1024 * 1024  # a "line" longer than this is cut (the rest is skipped)

# A line the engine certainly treats as vLLM INFO/DEBUG (a strict subset of what
# ``normalize`` recognises, so skipping it never changes a result): an optional vLLM process
# prefix, then ``INFO mm-dd hh:mm:ss [file.py:N] `` or uvicorn's ``INFO:  ``. ``\n(?!...)``
# finds the start of every other line. ANSI codes and carriage returns can change what a
# line shows, so lines with them are always fed (see ``_ALWAYS``).
_HEALTHY = (
    rb"(?:\([A-Za-z_][\w.\-]* pid=\d+\) )?(?:INFO|DEBUG)"
    rb"(?: \d\d-\d\d \d\d:\d\d:\d\d \[[\w.\-/]+:\d+\] |:  )"
)
_NON_INFO = re.compile(rb"\n(?!" + _HEALTHY + rb")")
_HEALTHY_AT_START = re.compile(_HEALTHY)
_ALWAYS = (b"\x1b",)


@dataclass
class ScanResult:
    diagnoses: list[Diagnosis]
    lines: int = 0
    bytes_read: int = 0
    candidate_lines: int = 0
    fed_lines: int = 0
    truncated_lines: int = 0
    notes: list[str] = field(default_factory=list)


def _candidate_offsets(chunk: bytes, cat: CompiledCatalogue) -> list[int]:
    """Start offsets (in ``chunk``) of lines worth feeding to the engine."""
    starts: set[int] = set()
    if not _HEALTHY_AT_START.match(chunk):
        starts.add(0)
    starts.update(m.start() + 1 for m in _NON_INFO.finditer(chunk))
    for needle in (*cat.info_gates_bytes, *cat.context_literals_bytes, *_ALWAYS):
        pos = chunk.find(needle)
        while pos != -1:
            starts.add(chunk.rfind(b"\n", 0, pos) + 1)
            pos = chunk.find(needle, pos + len(needle))
    pos = chunk.find(b"\r")
    while pos != -1:  # a carriage return inside a line (not a CRLF line ending)
        if chunk[pos + 1 : pos + 2] != b"\n":
            starts.add(chunk.rfind(b"\n", 0, pos) + 1)
        pos = chunk.find(b"\r", pos + 1)
    size = len(chunk)
    return sorted(s for s in starts if s < size)


def _windows(chunk: bytes, offsets: list[int], window: int) -> list[tuple[int, int]]:
    """Merged byte ranges [start, end) covering each candidate line +- ``window`` lines."""
    ranges: list[tuple[int, int]] = []
    for off in offsets:
        start = off
        for _ in range(window):
            if start == 0:
                break
            start = chunk.rfind(b"\n", 0, start - 1) + 1
        end = off
        for _ in range(window + 1):
            nl = chunk.find(b"\n", end)
            if nl == -1:
                end = len(chunk)
                break
            end = nl + 1
        if ranges and start <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(end, ranges[-1][1]))
        else:
            ranges.append((start, end))
    return ranges


def iter_candidates(
    path: str | Path,
    *,
    catalogue: CompiledCatalogue | None = None,
    start_line: int = 1,
    offset: int = 0,
    window: int = WINDOW,
    stats: ScanResult | None = None,
) -> Iterator[tuple[int, str]]:
    """(line number, text) of candidate lines and their context, in file order."""
    cat = catalogue or load_catalogue()
    st = stats or ScanResult(diagnoses=[])
    line_no = start_line  # number of the first line in ``carry + chunk``
    carry = b""
    skipping = False  # inside an over-long line whose head was already emitted
    with open(path, "rb") as fh:
        if offset:
            fh.seek(offset)
        while True:
            block = fh.read(CHUNK)
            st.bytes_read += len(block)
            eof = not block
            data = carry + block
            if skipping:
                nl = data.find(b"\n")
                if nl == -1:
                    carry = b""
                    if eof:
                        break
                    continue
                data = data[nl + 1 :]
                line_no += 1
                skipping = False
            cut = len(data) if eof else data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) > MAX_CARRY:
                    st.truncated_lines += 1
                    yield line_no, data[:MAX_CARRY].decode("utf-8", errors="replace")
                    st.fed_lines += 1
                    carry, skipping = b"", True
                else:
                    carry = data
                if eof:
                    break
                continue
            chunk, carry = data[:cut], data[cut:]
            offsets = _candidate_offsets(chunk, cat)
            st.candidate_lines += len(offsets)
            prev, n = 0, line_no  # n: number of the line starting at ``prev``
            for start, end in _windows(chunk, offsets, window):
                n += chunk.count(b"\n", prev, start)
                prev = start
                seg = chunk[start:end]
                parts = seg.split(b"\n")
                if seg.endswith(b"\n"):
                    parts.pop()
                for i, raw in enumerate(parts):
                    yield n + i, raw.decode("utf-8", errors="replace")
                st.fed_lines += len(parts)
            lines_in_chunk = chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)
            line_no += lines_in_chunk
            st.lines += lines_in_chunk
            if eof:
                break


def tail_offset(path: str | Path, lines: int) -> tuple[int, int]:
    """(byte offset, 1-based line number) where the last ``lines`` lines of a file start."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 1
    with open(path, "rb") as fh:
        newlines = 0
        while chunk := fh.read(CHUNK):
            newlines += chunk.count(b"\n")
        fh.seek(size - 1)
        ends_nl = fh.read(1) == b"\n"
        total = newlines if ends_nl else newlines + 1
        if lines >= total:
            return 0, 1
        # The wanted start follows the ``lines``-th newline counted backwards from the end,
        # not counting a final newline.
        pos = size - 1 if ends_nl else size
        found = 0
        while pos > 0:
            step = min(CHUNK, pos)
            fh.seek(pos - step)
            buf = fh.read(step)
            idx = len(buf)
            while True:
                idx = buf.rfind(b"\n", 0, idx)
                if idx == -1:
                    break
                found += 1
                if found == lines:
                    return pos - step + idx + 1, total - lines + 1
            pos -= step
    return 0, 1


def diagnose_file(
    path: str | Path,
    *,
    host: str | None = None,
    tail: int | None = None,
    catalogue: CompiledCatalogue | None = None,
) -> ScanResult:
    """Diagnose a local log file of any size (``tail``: only its last N lines)."""
    cat = catalogue or load_catalogue()
    offset, first = (0, 1)
    if tail is not None and tail > 0:
        offset, first = tail_offset(path, tail)
    with open(path, "rb") as fh:
        fh.seek(offset)
        head = fh.read(256 * 1024).split(b"\n")[:FOLD_SAMPLE]
    head_text = [visible(h.decode("utf-8", errors="replace")) for h in head]
    if newest_first(head_text):
        # a log printed newest line first (a pasted viewer excerpt): read whole, bottom-up
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
        rows = text.split("\n")
        if rows and rows[-1] == "":
            rows.pop()
        found = diagnose_numbered(enumerate(rows, first), host=host, catalogue=cat)
        return ScanResult(diagnoses=found, lines=len(rows), bytes_read=len(text))
    fold = fold_width(head_text)
    stats = ScanResult(diagnoses=[])
    window = WINDOW if fold is None else max(WINDOW, 8)
    engine = Engine(cat, host=host, fold=fold)
    for n, text in iter_candidates(
        path, catalogue=cat, start_line=first, offset=offset, window=window, stats=stats
    ):
        engine.feed(n, text)
    engine.flush()
    stats.diagnoses = engine.results()
    return stats

"""Property tests of the line splitters fleet runs over host output: the stream splitter
of ``logs --follow`` (cut long lines, linear time) and the on-host line counter of
``source show`` (lines and the longest line, across read blocks)."""

from __future__ import annotations

from pathlib import Path

from hostile_support import SCALE, Tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.onhost import source as onhost_source
from fleet.transport.runner import split_lines

CHUNKS = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"\n")), max_size=12)


@settings(max_examples=1000 * SCALE, deadline=None, database=None)
@given(CHUNKS, st.integers(min_value=1, max_value=16))
def test_split_lines_is_split_then_cut(chunks: list[bytes], max_line: int) -> None:
    data = b"".join(chunks)
    *lines, last = data.split(b"\n")
    expected = [line[:max_line].decode("utf-8", "replace") for line in lines]
    if last:
        expected.append(last[:max_line].decode("utf-8", "replace"))
    assert list(split_lines(iter(chunks), max_line)) == expected


def test_split_lines_of_a_huge_line_is_bounded(tally: Tally) -> None:
    tally.attempt("stream parsers")
    blocks = (b"\0" * 65536 for _ in range(4096))  # 256 MiB without a newline
    out = list(split_lines(iter([*blocks, b"\nnext\n"]), 1 << 20))
    assert [len(out[0]), out[1:]] == [1 << 20, ["next"]]


@settings(
    max_examples=100 * SCALE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(st.one_of(st.integers(0, 99), st.integers(2**20 - 3, 2**20 + 3)), max_size=4),
    st.booleans(),
)
def test_count_lines_across_blocks(
    tmp_path: Path, lengths: list[int], newline_at_end: bool
) -> None:
    data = b"\n".join(b"x" * n for n in lengths) + (b"\n" if newline_at_end and lengths else b"")
    path = tmp_path / "f.py"
    path.write_bytes(data)
    lines = data.split(b"\n")
    assert onhost_source._count_lines(str(path)) == (data.count(b"\n"), max(map(len, lines)))

"""The local large-file scanner skips INFO lines without decoding them -- never a result."""

# ruff: noqa: E501  (real vLLM messages are long lines)

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.diagnosis import diagnose_text
from fleet.diagnosis.scan import diagnose_file, iter_candidates, tail_offset

INFO = "(APIServer pid=1) INFO 11-02 10:22:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s"
LOAD = "AssertionError: Attempted to load weight (torch.Size([7168, 21504])) into parameter (torch.Size([4096, 12288]))"


def same(path: Path) -> list[tuple[str, list[int]]]:
    a = [(d.id, [e.line for e in d.evidence]) for d in diagnose_text(path.read_bytes())]
    b = [(d.id, [e.line for e in d.evidence]) for d in diagnose_file(path).diagnoses]
    assert a == b
    return b


def test_carriage_return_inside_an_info_line(tmp_path: Path) -> None:
    log = tmp_path / "cr.log"
    log.write_bytes(
        (INFO + "\n").encode() * 50
        + (INFO + "\rValueError: No available memory for the cache blocks.\n").encode()
        + (INFO + "\n").encode() * 50
    )
    assert same(log) == [("kv-cache-no-memory", [51])]


def test_crlf_line_endings(tmp_path: Path) -> None:
    log = tmp_path / "crlf.log"
    log.write_bytes((INFO + "\r\n").encode() * 20 + b"RuntimeError: No CUDA GPUs are available\r\n")
    assert same(log) == [("no-gpu-visible", [21])]


def test_ansi_coloured_info_prefix(tmp_path: Path) -> None:
    log = tmp_path / "ansi.log"
    line = "(APIServer pid=1) \x1b[32mINFO\x1b[0m 11-02 10:22:00 [a.py:1] # GPU blocks: 0, # CPU blocks: 9\n"
    log.write_text(INFO + "\n" + line)
    assert same(log) == [("kv-cache-no-memory", [2])]


def test_context_line_at_info_level_far_from_the_error(tmp_path: Path) -> None:
    """``Loading drafter model...`` is an INFO line; the drafter rule needs it as context."""
    drafter = (
        "(Worker_TP0 pid=9) INFO 11-02 10:21:10 [gpu_model_runner.py:4370] Loading drafter model..."
    )
    log = tmp_path / "ctx.log"
    log.write_text("\n".join([drafter, *[INFO] * 40, LOAD]) + "\n")
    assert same(log) == [("drafter-incompatible", [42])]
    far = tmp_path / "far.log"
    far.write_text("\n".join([drafter, *[INFO] * 80, LOAD]) + "\n")
    assert same(far) == [("checkpoint-weight-mismatch", [82])]


def test_candidate_numbering_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fleet.diagnosis.scan as scan

    monkeypatch.setattr(scan, "CHUNK", 4096)  # many chunk boundaries
    lines = [INFO if i % 37 else f"ERROR 11-02 10:00:00 [x.py:1] line={i}" for i in range(1, 3001)]
    log = tmp_path / "n.log"
    log.write_text("\n".join(lines))  # no final newline
    got = {n: t for n, t in iter_candidates(log, window=0)}
    assert sorted(got) == [i for i in range(1, 3001) if i % 37 == 0]
    assert all(t.endswith(f"line={n}") for n, t in got.items())


@pytest.mark.parametrize("ending", ["\n", ""])
def test_tail_offsets(tmp_path: Path, ending: str) -> None:
    log = tmp_path / "t.log"
    log.write_text("\n".join(f"l{i}" for i in range(1, 101)) + ending)
    offset, first = tail_offset(log, 10)
    assert first == 91
    assert log.read_bytes()[offset:].startswith(b"l91\n")
    assert tail_offset(log, 500) == (0, 1)
    result = diagnose_file(log, tail=10)
    assert result.lines == 10

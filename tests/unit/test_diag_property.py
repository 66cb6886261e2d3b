"""Property tests: hostile input never crashes the engine; the fast paths change nothing."""

# ruff: noqa: E501  (real vLLM messages are long lines)

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.diagnosis import Diagnosis, diagnose, diagnose_text
from fleet.diagnosis.scan import diagnose_file

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "logs"
HEALTHY = [
    "(APIServer pid=1) INFO 11-02 10:22:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s",
    '(APIServer pid=1) INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK',
    "INFO 11-02 10:14:01 [__init__.py:216] Automatically detected platform cuda.",
    "Loading safetensors checkpoint shards:  45% Completed | 29/64 [01:02<01:15,  2.15s/it]",
    "",
]
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def corpus_lines() -> list[str]:
    out: list[str] = []
    for log in sorted(CORPUS.glob("*.log"))[::3]:
        out.extend(log.read_text(encoding="utf-8").splitlines())
    return out


CORPUS_LINES = corpus_lines()


def _ok(result: object) -> None:
    assert isinstance(result, list)
    assert all(isinstance(d, Diagnosis) for d in result)


@SETTINGS
@given(st.binary(max_size=20000))
def test_binary_garbage_never_crashes(data: bytes) -> None:
    _ok(diagnose_text(data))


@SETTINGS
@given(st.binary(max_size=5000))
def test_invalid_utf8_file_never_crashes(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("garbage") / "x.log"
    path.write_bytes(b"\xff\xfe" + data + b"\n\x80ERROR: \xc3(\n" + data)
    result = diagnose_file(path)
    _ok(result.diagnoses)


@SETTINGS
@given(st.lists(st.text(max_size=300), max_size=200))
def test_arbitrary_text_lines_never_crash(lines: list[str]) -> None:
    _ok(diagnose(lines))


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    result = diagnose_file(path)
    assert result.diagnoses == []
    assert result.lines == 0
    assert diagnose_text(b"") == []


@pytest.mark.timeout(120)
def test_ten_megabyte_single_line(tmp_path: Path) -> None:
    head = b"RuntimeError: CUDA error: out of memory "
    body = (b"x" * 1023 + b"(") * (10 * 1024)
    path = tmp_path / "one-line.log"
    path.write_bytes(head + body)  # 10 MB, no newline at all
    result = diagnose_file(path)
    assert [d.id for d in result.diagnoses] == ["cuda-oom"]
    assert [d.id for d in diagnose_text(head + body)] == ["cuda-oom"]
    # and a 10 MB line of pattern-ish fragments (no catastrophic backtracking)
    nasty = ("Error: " + "(" * 50 + "Tried to allocate " + "1." * 40) * 40000
    _ok(diagnose([nasty[: 10 * 1024 * 1024]]))


@pytest.mark.timeout(120)
def test_very_long_line_between_normal_lines(tmp_path: Path) -> None:
    path = tmp_path / "mixed.log"
    path.write_bytes(
        b"INFO 11-02 10:14:01 [a.py:1] ok\n"
        + b"y" * (9 * 1024 * 1024)
        + b"\n"
        + b"ValueError: No available memory for the cache blocks.\n"
    )
    result = diagnose_file(path)
    assert [d.id for d in result.diagnoses] == ["kv-cache-no-memory"]
    assert result.diagnoses[0].evidence[0].line == 3


@SETTINGS
@given(st.data())
def test_file_scanner_equals_engine_on_random_logs(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Skipping INFO lines without decoding them never changes the result."""
    n = data.draw(st.integers(min_value=0, max_value=120))
    pool = CORPUS_LINES + HEALTHY * 20
    idx = data.draw(
        st.lists(st.integers(min_value=0, max_value=len(pool) - 1), min_size=n, max_size=n)
    )
    lines = [pool[i] for i in idx]
    path = tmp_path_factory.mktemp("mix") / "mix.log"
    path.write_text("\n".join(lines) + ("\n" if data.draw(st.booleans()) else ""), encoding="utf-8")
    a = [(d.id, [e.line for e in d.evidence]) for d in diagnose_text(path.read_bytes())]
    b = [(d.id, [e.line for e in d.evidence]) for d in diagnose_file(path).diagnoses]
    assert a == b


@SETTINGS
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_healthy_lines_do_not_change_the_primary(seed: int) -> None:
    rng = random.Random(seed)
    logs = sorted(CORPUS.glob("*--v1.log"))
    log = logs[rng.randrange(len(logs))]
    lines = log.read_text(encoding="utf-8").splitlines()
    expected = diagnose(lines)[0].id
    noisy: list[str] = []
    for line in lines:
        noisy.extend(rng.choice(HEALTHY[:3]) for _ in range(rng.randrange(3)))
        noisy.append(line)
    assert diagnose(noisy)[0].id == expected


@pytest.mark.timeout(300)
def test_adversarial_lines_for_every_signature() -> None:
    """Each pattern's own literal padded with 16 KB of look-alike characters: linear time
    regexes finish (a catastrophic-backtracking one would hit the timeout)."""
    from fleet.diagnosis.catalogue import load_catalogue

    cat = load_catalogue()
    lines: list[str] = []
    for pat in cat.patterns:
        for lit in pat.literals:
            for fill in ("a", "_a.", "/1.", "( '"):
                pad = fill * (16384 // len(fill))
                lines += [lit + pad, pad + lit, pad[:8000] + lit + pad[:8000]]
    _ok(diagnose(lines))

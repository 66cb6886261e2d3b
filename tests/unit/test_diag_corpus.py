"""Accuracy on labelled logs: the real dev logs from vLLM issues and fleet's own corpus.

The primary (first) diagnosis must equal the label. Accuracy is reported per taxonomy id
(``pytest -s`` prints the table). Both corpora also go through the local large-file scanner
and the remote ``grep`` pipeline (run by a real ``sh``), which must agree with the engine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from fleet.diagnosis import diagnose_numbered, diagnose_text
from fleet.diagnosis.host_logs import Header, grep_command, parse_grep
from fleet.diagnosis.scan import diagnose_file

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "corpus"
DEV = CORPUS / "dev"


def _labels(root: Path, logs: Path) -> dict[Path, str]:
    data = json.loads((root / "labels.json").read_text())
    return {logs / name: entry["id"] for name, entry in data.items()}


def own_corpus() -> dict[Path, str]:
    return _labels(CORPUS, CORPUS / "logs")


def dev_corpus() -> dict[Path, str]:
    return _labels(DEV, DEV)


def accuracy(labels: dict[Path, str]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    wrong: list[str] = []
    for path, label in sorted(labels.items()):
        result = diagnose_text(path.read_bytes())
        got = result[0].id if result else None
        per[label][1] += 1
        if got == label:
            per[label][0] += 1
        else:
            wrong.append(f"{path.name}: expected {label}, got {[d.id for d in result]}")
    return {k: (v[0], v[1]) for k, v in per.items()}, wrong


def table(per: dict[str, tuple[int, int]]) -> str:
    rows = [f"{k:34s} {ok}/{n}" for k, (ok, n) in sorted(per.items())]
    ok = sum(v[0] for v in per.values())
    n = sum(v[1] for v in per.values())
    return "\n".join([*rows, f"{'total':34s} {ok}/{n} = {ok / n:.1%}"])


def test_dev_corpus_primary_diagnosis_matches_label() -> None:
    labels = dev_corpus()
    assert {p.name for p in DEV.glob("*.log")} == {p.name for p in labels}, "a label per log"
    per, wrong = accuracy(labels)
    print("\ndev corpus accuracy per id\n" + table(per))
    assert not wrong, "\n".join(wrong)


def test_own_corpus_accuracy_per_id() -> None:
    from fleet.diagnosis.models import OBSERVED_BY_FLEET, TAXONOMY

    per, wrong = accuracy(own_corpus())
    print("\nown corpus accuracy per id\n" + table(per))
    assert set(per) == set(TAXONOMY) - OBSERVED_BY_FLEET  # those are in no log
    assert not wrong, "\n".join(wrong)


def test_own_corpus_covers_every_shape() -> None:
    data = json.loads((CORPUS / "labels.json").read_text())
    shapes = {entry["shape"] for entry in data.values()}
    assert {"v1", "plain", "interleaved", "truncated", "noisy"} <= shapes
    for entry in data.values():
        assert entry["source"].strip()


def _all_logs() -> list[Path]:
    return sorted((CORPUS / "logs").glob("*.log")) + sorted(DEV.glob("*.log"))


def _summary(diags: list) -> list[tuple[str, list[int]]]:  # type: ignore[type-arg]
    return [(d.id, [e.line for e in d.evidence]) for d in diags]


@pytest.mark.parametrize("path", _all_logs(), ids=lambda p: p.name)
def test_file_scanner_agrees_with_the_engine(path: Path) -> None:
    expected = _summary(diagnose_text(path.read_bytes()))
    assert _summary(diagnose_file(path).diagnoses) == expected


@pytest.mark.skipif(
    shutil.which("grep") is None or shutil.which("awk") is None, reason="grep/awk not installed"
)
@pytest.mark.parametrize("path", _all_logs(), ids=lambda p: p.name)
def test_remote_filter_pipeline_agrees_on_the_primary(path: Path) -> None:
    """The exact command fleet runs on a host, run here by sh: same primary diagnosis."""
    res = subprocess.run(["sh", "-c", grep_command(str(path))], capture_output=True, check=False)
    assert res.returncode == 0, res.stderr
    header = Header()
    lines = res.stdout.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    pairs = list(parse_grep(lines, header))
    assert header.size == path.stat().st_size
    remote = diagnose_numbered(pairs)
    local = diagnose_text(path.read_bytes())
    assert bool(remote) == bool(local)
    if local:
        assert remote[0].id == local[0].id
        assert remote[0].evidence[0].line == local[0].evidence[0].line

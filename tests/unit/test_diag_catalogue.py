"""The catalogue is data: validated at load, complete, and its prefilter never hides a match."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.diagnosis.catalogue import CatalogueError, load_catalogue, parse_catalogue
from fleet.diagnosis.literals import required_literals
from fleet.diagnosis.models import OBSERVED_BY_FLEET, TAXONOMY
from fleet.diagnosis.normalize import normalize

CORPUS = Path(__file__).resolve().parents[1] / "corpus"


def raw_catalogue() -> dict[str, Any]:
    text = resources.files("fleet.diagnosis").joinpath("catalogue.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def test_shipped_catalogue_loads_and_covers_the_taxonomy() -> None:
    cat = load_catalogue()
    assert set(cat.rules) == set(TAXONOMY)
    for rule_id in TAXONOMY:
        rule = cat.rules[rule_id]
        assert rule.summary and rule.root_cause.strip() and rule.remedy.strip()
        if rule_id in OBSERVED_BY_FLEET:
            assert not rule.patterns, f"{rule_id}: fleet's own observation has no log line"
        elif rule_id != "unrecognized-error":
            assert rule.patterns, f"{rule_id} has no signature"
            for spec in rule.patterns:
                assert spec.source.strip()


def test_every_taxonomy_id_has_a_corpus_sample() -> None:
    """Except the ids fleet observes itself: the preflight and serve tests hold them."""
    labels = json.loads((CORPUS / "labels.json").read_text())
    found = {lab["id"] for lab in labels.values()}
    assert set(TAXONOMY) - OBSERVED_BY_FLEET <= found
    assert not OBSERVED_BY_FLEET & found


def test_fix_templates_where_fleet_can_act() -> None:
    cat = load_catalogue()
    assert "fleet patch --host {host}" in cat.rules["eagle3-unsupported-model"].fix
    assert "fleet patch --host {host}" in cat.rules["eagle3-target-not-allowlisted"].fix
    assert any("--max-model-len {fit_len}" in f for f in cat.rules["kv-cache-too-small"].fix)
    assert any("{port}" in f for f in cat.rules["port-in-use"].fix)


def test_a_bad_regex_fails_validation() -> None:
    data = raw_catalogue()
    data["rules"][0]["patterns"][0]["regex"] = "Model does not support (EAGLE3"
    with pytest.raises(CatalogueError, match="invalid regex"):
        parse_catalogue(data)


def test_a_missing_taxonomy_entry_fails_validation() -> None:
    data = raw_catalogue()
    data["rules"] = [r for r in data["rules"] if r["id"] != "disk-full"]
    with pytest.raises(CatalogueError, match="disk-full"):
        parse_catalogue(data)


def test_an_unknown_id_fails_validation() -> None:
    data = raw_catalogue()
    data["rules"][0]["id"] = "eagle-3-unsupported"
    with pytest.raises(CatalogueError, match="unknown taxonomy id"):
        parse_catalogue(data)


def test_a_pattern_without_a_literal_fails_validation() -> None:
    data = raw_catalogue()
    data["rules"][0]["patterns"][0]["regex"] = r"\w+ \d+"
    data["rules"][0]["patterns"][0].pop("example", None)
    with pytest.raises(CatalogueError, match="no literal"):
        parse_catalogue(data)


def test_a_literal_outside_the_gates_fails_validation() -> None:
    data = raw_catalogue()
    data["rules"][0]["patterns"].append({"regex": "Zebra crossing detected", "source": "test"})
    with pytest.raises(CatalogueError, match="none of the gates"):
        parse_catalogue(data)


def test_an_example_that_does_not_match_fails_validation() -> None:
    data = raw_catalogue()
    spec = data["rules"][0]["patterns"][0]
    spec["example"] = "RuntimeError: something else entirely"
    with pytest.raises(CatalogueError, match="does not match its example"):
        parse_catalogue(data)


def test_a_bad_template_field_fails_validation() -> None:
    data = copy.deepcopy(raw_catalogue())
    data["rules"][0]["summary"] = ["{model_class!r} is wrong"]
    with pytest.raises(CatalogueError, match="template field"):
        parse_catalogue(data)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (r"The model'?s max seq len \((?P<a>\d+)\) is larger", ["s max seq len ("]),
        (r"(?:Eagle3|eagle3) is only supported for", [" is only supported for"]),
        (
            r"CUDA (?:error: )?out of memory|HIP out of memory",
            ["HIP out of memory", "out of memory"],
        ),
        (r"a+b", []),
    ],
)
def test_required_literals(pattern: str, expected: list[str]) -> None:
    got = required_literals(pattern)
    assert sorted(got) == sorted(expected)
    for lit in got:  # every match contains one of them
        for sample in (
            "The model's max seq len (1) is larger",
            "Eagle3 is only supported for",
            "CUDA out of memory",
            "HIP out of memory",
        ):
            if re.search(pattern, sample):
                assert any(lit in sample for lit in got)


def _corpus_lines() -> list[str]:
    lines: list[str] = []
    for log in sorted((CORPUS / "logs").glob("*.log")):
        lines.extend(log.read_text(encoding="utf-8").splitlines())
    dev = sorted((CORPUS / "dev").glob("*.log"))
    assert dev, "the dev crash logs are in tests/corpus/dev/"
    for log in dev:
        lines.extend(log.read_text(encoding="utf-8", errors="replace").splitlines())
    return lines


def test_every_match_contains_its_prefilter_literal_and_a_gate() -> None:
    """The prefilters are necessary conditions: check them on every line we have."""
    cat = load_catalogue()
    checked = 0
    for raw in _corpus_lines():
        text = normalize(raw).text
        for pat in cat.patterns:
            if pat.regex.search(text):
                checked += 1
                assert any(lit in text for lit in pat.literals), (pat.spec.regex, text)
                assert any(lit in raw for lit in cat.prefilter_literals), (pat.spec.regex, raw)
                assert cat.is_candidate(raw), raw
    assert checked > 100


@pytest.mark.skipif(shutil.which("grep") is None, reason="grep not installed")
def test_grep_prefilter_selects_every_line_the_engine_matches(tmp_path: Path) -> None:
    """The ERE built from the literals, run by the real grep -E, keeps every matching line."""
    from fleet.diagnosis.host_logs import prefilter_regex

    cat = load_catalogue()
    lines = _corpus_lines()
    log = tmp_path / "all.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = subprocess.run(
        ["grep", "-a", "-n", "-E", "-e", prefilter_regex(cat), str(log)],
        capture_output=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    kept = {int(x.split(b":", 1)[0]) for x in res.stdout.splitlines()}
    for i, raw in enumerate(lines, 1):
        text = normalize(raw).text
        if any(p.regex.search(text) for p in cat.patterns) or cat.exception_line.match(text):
            assert i in kept, raw
    assert len(kept) < len(lines)

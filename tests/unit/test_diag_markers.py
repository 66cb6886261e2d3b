"""Fleet's own event markers round-trip through the catalogue."""

from __future__ import annotations

import pytest

from fleet.diagnosis import diagnose
from fleet.diagnosis.markers import KINDS, event, marker
from fleet.diagnosis.models import TAXONOMY


@pytest.mark.parametrize(
    ("kind", "values", "summary"),
    [
        ("load-stalled", {"phase": "weights", "idle_s": 900}, "900 s in phase weights"),
        ("load-stalled", {"idle_s": 900, "phase": "weights"}, "900 s in phase weights"),
        ("load-timeout", {"phase": "compile", "timeout_s": 2400}, "2400 s (last phase: compile)"),
        ("process-exited", {"code": 137, "signal": "SIGKILL"}, "exited with code 137"),
        ("process-exited", {}, "exited unexpectedly"),
        ("supervisor-died", {"supervisor": "supervisord"}, "supervisord died while vLLM"),
        ("patch-not-applied", {"patch": "eagle3-deepseek", "version": "0.17.0"}, "eagle3-deepseek"),
    ],
)
def test_marker_round_trip(kind: str, values: dict[str, object], summary: str) -> None:
    line = marker(kind, **values)
    assert line.startswith(f"[fleet] {kind}")
    d = event(kind, host="b200-01", **values)
    assert d.id == kind
    assert summary in d.summary
    assert [x.id for x in diagnose(["INFO 11-02 10:14:01 [a.py:1] ok", line])] == [kind]


def test_marker_rejects_unsafe_values() -> None:
    assert set(KINDS) >= {"load-stalled", "load-timeout", "process-exited", "supervisor-died"}
    assert all(kind in TAXONOMY for kind in KINDS)
    with pytest.raises(ValueError):
        marker("load-stalled", phase="two words")
    with pytest.raises(ValueError):
        marker("bogus")

"""The one per-host result type: statuses, codes, exit codes and --json entries."""

from __future__ import annotations

import pytest

from fleet.errors import CODES, ConnectError, FleetError, OperationFailed, UsageError
from fleet.transport import HostOutcome, Verdict, exit_code, hosts_json


class Report:
    def __init__(self, verdict: Verdict) -> None:
        self._verdict = verdict

    def verdict(self) -> Verdict:
        return self._verdict


@pytest.mark.parametrize(
    ("exc", "status", "code", "exit"),
    [
        (ConnectError("h", "refused", code="connect-refused"), "unreachable", "connect-refused", 3),
        (
            UsageError("h: path leaves the tree", code="path-escapes-tree"),
            "refused",
            "path-escapes-tree",
            2,
        ),
        (OperationFailed("h: boom", code="python-missing"), "failed", "python-missing", 1),
        (KeyError("x"), "failed", "internal-error", 1),
    ],
)
def test_errors_become_outcomes(exc: Exception, status: str, code: str, exit: int) -> None:
    o: HostOutcome[object] = HostOutcome.of_error("h", exc)
    assert (o.status, o.code, o.exit, o.exc) == (status, code, exit, exc)
    assert not o.ok and o.error and not o.error.startswith("h: ")


def test_values_may_decide_their_status() -> None:
    changed = HostOutcome.of_value("h", Report(Verdict("changed")))
    assert changed.ok and changed.changed and changed.exit == 0
    conflict = HostOutcome.of_value("h", Report(Verdict("failed", "patch-conflict", "anchor")))
    assert not conflict.ok and conflict.code == "patch-conflict" and conflict.exit == 1
    refused = HostOutcome.of_value("h", Report(Verdict("refused", "preflight-failed")))
    assert refused.status == "refused" and refused.exit == 1
    assert HostOutcome.of_value("h", 42).status == "ok"


def test_exit_code_precedence() -> None:
    ok = HostOutcome("a", "ok", 1)
    failed = HostOutcome("b", "failed", exit=1)
    down = HostOutcome("c", "unreachable", exit=3)
    bad = HostOutcome("d", "refused", exit=2)
    assert exit_code([ok]) == 0
    assert exit_code([ok], problem_found=True) == 1
    assert exit_code([ok, failed]) == 1
    assert exit_code([ok, failed, down]) == 3
    assert exit_code([ok, failed, down, bad]) == 2  # bad input is the first thing to fix


def test_json_entries_are_built_in_one_place() -> None:
    outcomes = [
        HostOutcome("a", "changed", {"x": 1}),
        HostOutcome("b", "failed", {"x": 2}, error="conflict", code="patch-conflict"),
        HostOutcome("c", "unreachable", error="refused", hint="check", code="connect-refused"),
    ]
    doc = hosts_json(outcomes, lambda v: {"x": v["x"], "ok": "ignored"})["hosts"]
    assert doc["a"] == {"ok": True, "changed": True, "x": 1}
    assert doc["b"] == {
        "ok": False,
        "changed": False,
        "status": "failed",
        "code": "patch-conflict",
        "error": "conflict",
        "x": 2,
    }
    assert doc["c"]["hint"] == "check" and doc["c"]["code"] == "connect-refused"


def test_every_code_is_documented() -> None:
    """Each code a FleetError can carry is in fleet.errors.CODES and in the README table."""
    import inspect
    import re
    from pathlib import Path

    import fleet

    root = Path(fleet.__file__).resolve().parent
    used: set[str] = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r'code="([a-z0-9-]+)"', text))
        used |= set(re.findall(r'^\s+code = "([a-z0-9-]+)"', text, re.M))
        used |= set(
            re.findall(r'Refused\([^)]*?"([a-z][a-z0-9]*(?:-[a-z0-9]+)+)"\s*\)', text, re.S)
        )
        used |= set(re.findall(r'Verdict\(\s*"\w+",\s*"([a-z0-9-]+)"', text))
    assert used, "no codes found"
    missing = sorted(used - set(CODES))
    assert not missing, f"codes used but not in fleet.errors.CODES: {missing}"
    readme = (root.parent / "README.md").read_text()
    undocumented = sorted(c for c in CODES if f"`{c}`" not in readme)
    assert not undocumented, f"codes missing from the README's table: {undocumented}"
    assert inspect.isclass(FleetError)

"""The one way a :class:`~fleet.diagnosis.models.Diagnosis` is made from fleet's own
observations (preflight, a stalled or timed-out load, a dead supervisor, a patch check):
the taxonomy id's catalogue entry rendered with the observed values, the same summary,
remedy and fix a crash log of that kind gets, and what was observed as the evidence.
"""

from __future__ import annotations

from typing import Any

from fleet.diagnosis.models import Diagnosis, Evidence


def diagnosis(
    rule_id: str,
    *,
    host: str | None,
    evidence: list[str],
    seen_by: str,
    **values: Any,
) -> Diagnosis:
    """A finding of ``rule_id`` rendered from the catalogue with ``values``; each
    ``evidence`` line is prefixed with who saw it (``preflight: ...``, ``follow: ...``)."""
    from fleet.diagnosis.catalogue import load_catalogue
    from fleet.diagnosis.engine import render

    rule = load_catalogue().rules[rule_id]
    vals = {k: str(v) for k, v in values.items() if v is not None}
    if host is not None:
        vals["host"] = host
    summary, fix, vals = render(rule, vals)
    return Diagnosis(
        id=rule.id,
        severity=rule.severity,
        title=rule.title,
        summary=summary,
        root_cause=rule.root_cause.strip(),
        remedy=rule.remedy.strip(),
        fix=fix,
        evidence=[Evidence(line=0, text=f"{seen_by}: {e}") for e in evidence],
        values=vals,
        role="cause",
        specificity=rule.specificity,
        confidence="high",
    )

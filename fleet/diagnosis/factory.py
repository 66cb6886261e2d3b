"""The one place a :class:`~fleet.diagnosis.models.Diagnosis` is made.

:func:`build` turns a catalogue rule and what was found into a diagnosis (the engine calls
it for every finding in a log); :func:`diagnosis` is the same for fleet's own
observations (preflight, a stalled or timed-out load, a dead supervisor, a patch check):
the taxonomy id's catalogue entry rendered with the observed values, the same summary,
remedy and fix a crash log of that kind gets, and what was observed as the evidence.
:func:`render` fills a rule's summary and fix templates (with the derived values, e.g. the
``--max-model-len`` that fits); :func:`with_values` renders a diagnosis again with more.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet.diagnosis.models import Diagnosis, Evidence
from fleet.redact import redact_text

if TYPE_CHECKING:
    from fleet.diagnosis.catalogue import CompiledCatalogue
    from fleet.diagnosis.models import Rule

_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


def build(
    rule: Rule,
    *,
    summary: str,
    fix: str | None,
    evidence: list[Evidence],
    values: dict[str, str],
    severity: str | None = None,
    context: list[Evidence] | None = None,
    count: int = 1,
    role: str = "cause",
    specificity: int | None = None,
    confidence: str = "high",
) -> Diagnosis:
    """A diagnosis of ``rule`` with what was found."""
    return Diagnosis(
        id=rule.id,
        severity=severity or rule.severity,
        title=rule.title,
        summary=summary,
        root_cause=rule.root_cause.strip(),
        remedy=rule.remedy.strip(),
        fix=fix,
        evidence=evidence,
        context=context or [],
        count=count,
        values=values,
        role=role,
        specificity=rule.specificity if specificity is None else specificity,
        confidence=confidence,
    )


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

    rule = load_catalogue().rules[rule_id]
    vals = {k: str(v) for k, v in values.items() if v is not None}
    if host is not None:
        vals["host"] = host
    summary, fix, vals = render(rule, vals)
    return build(
        rule,
        summary=summary,
        fix=fix,
        evidence=[Evidence(line=0, text=f"{seen_by}: {e}") for e in evidence],
        values=vals,
    )


# -- the templates of a rule's summary and fix ------------------------------------------


def _num(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _max_model_len_fit(values: dict[str, str]) -> dict[str, str]:
    for key in ("estimated_max_len", "kv_tokens"):
        n = _num(values.get(key))
        if n is not None and n > 0:
            return {"fit_len": str(int(n))}
    return {}


def _gpu_util_fit(values: dict[str, str]) -> dict[str, str]:
    free, total = _num(values.get("free")), _num(values.get("total"))
    if free is None or not total:
        return {}
    fit = math.floor((free / total) * 100 - 1) / 100
    return {"util_fit": f"{max(fit, 0.05):.2f}"}


def _tp_fit(values: dict[str, str]) -> dict[str, str]:
    heads, tp, gpus = _num(values.get("heads")), _num(values.get("tp")), _num(values.get("gpus"))
    limit = tp if tp is not None else gpus
    if gpus is not None and limit is not None:
        limit = min(limit, gpus)
    if limit is None or limit < 1:
        return {}
    if heads is None:
        return {"tp_fit": str(int(limit))} if gpus is not None else {}
    best = max(d for d in range(1, int(limit) + 1) if int(heads) % d == 0)
    return {"tp_fit": str(best)}


DERIVATIONS: dict[str, Callable[[dict[str, str]], dict[str, str]]] = {
    "max_model_len_fit": _max_model_len_fit,
    "gpu_util_fit": _gpu_util_fit,
    "tp_fit": _tp_fit,
}


def _fill(templates: list[str], values: dict[str, str]) -> str | None:
    """The first template whose every field has a value."""
    for tmpl in templates:
        names = _FIELD.findall(tmpl)
        if all(values.get(n) not in (None, "") for n in names):
            return _FIELD.sub(lambda m: values[m.group(1)], tmpl)
    return None


def render(rule: Rule, values: dict[str, str]) -> tuple[str, str | None, dict[str, str]]:
    """(summary, fix, values with derivations) for a rule and captured values.

    Captured values come from log lines, so everything returned is passed through
    :func:`fleet.redact.redact_text` (an API key in a message never reaches the output)."""
    vals = {k: redact_text(v) for k, v in values.items()}
    for name in rule.derive:
        fn = DERIVATIONS.get(name)
        if fn is not None:
            for k, v in fn(vals).items():
                vals.setdefault(k, v)
    summary = redact_text(_fill(rule.summary, vals) or rule.title)
    fix = _fill(rule.fix, vals) if rule.fix else None
    return summary, redact_text(fix) if fix else fix, vals


def with_values(
    diag: Diagnosis, catalogue: CompiledCatalogue | None = None, **extra: str
) -> Diagnosis:
    """Re-render a diagnosis with more values (e.g. the process holding a port, the host)."""
    from fleet.diagnosis.catalogue import load_catalogue

    cat = catalogue or load_catalogue()
    rule = cat.rules[diag.id]
    values = {**diag.values, **{k: v for k, v in extra.items() if v is not None}}
    summary, fix, vals = render(rule, values)
    return diag.model_copy(update={"summary": summary, "fix": fix, "values": vals})

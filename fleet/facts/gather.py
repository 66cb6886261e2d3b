"""Gather a host's facts in one round trip: the on-host ``facts`` script, then the parsers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from fleet.facts.models import HostFacts
from fleet.facts.parsers import parse_facts
from fleet.onhost.client import run_onhost

if TYPE_CHECKING:
    from fleet.transport import Runner

FACTS_TIMEOUT = 120.0


class FactsAnswer(BaseModel):
    """The facts script's answer: raw observations per part (see fleet/onhost/facts.py)."""

    parts: dict[str, dict[str, Any]]


def gather_facts(conn: Runner, *, timeout: float = FACTS_TIMEOUT) -> HostFacts:
    """Run the facts script on ``conn``'s host with its ``python`` and parse the answer.

    One command over the already-open connection. Raises (the host's outcome becomes
    "failed") when the interpreter is missing or the answer cannot be understood; a single
    failed fact only lands in ``HostFacts.errors``."""
    answer = run_onhost(conn, "facts", {"op": "facts"}, FactsAnswer, timeout=timeout)
    return parse_facts({"parts": answer.parts})

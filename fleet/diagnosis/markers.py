"""Fleet's own events in a vLLM log: ``[fleet] <id> key=value ...``.

``fleet serve`` watches a load; when it stalls, times out or the process exits it appends a
marker line to the log, so ``fleet logs --diagnose`` (now or later, locally or remotely) sees
the same event the supervisor saw::

    [fleet] load-stalled phase=weights idle_s=900
    [fleet] load-timeout timeout_s=2400 phase=compile
    [fleet] process-exited code=137 signal=SIGKILL

:func:`event` builds the corresponding :class:`Diagnosis` directly (no log needed).
"""

from __future__ import annotations

import re

from fleet.diagnosis.catalogue import CompiledCatalogue, load_catalogue
from fleet.diagnosis.engine import diagnose
from fleet.diagnosis.models import Diagnosis

KINDS = (
    "load-stalled", "load-timeout", "process-exited", "supervisor-died", "patch-not-applied",
    "node-mismatch", "multinode-unsupported", "node-unreachable", "network-interface-wrong",
    "node-ip-duplicate",
)  # fmt: skip
_VALUE = re.compile(r"[A-Za-z0-9_.:/\-]+")
_KEY = re.compile(r"[a-z][a-z0-9_]*")


def marker(kind: str, **values: object) -> str:
    """The marker line (no newline) for one of :data:`KINDS`."""
    if kind not in KINDS:
        raise ValueError(f"unknown fleet event {kind!r} (one of {', '.join(KINDS)})")
    parts = [f"[fleet] {kind}"]
    for key, value in values.items():
        if value is None:
            continue
        text = str(value)
        if not _KEY.fullmatch(key) or not _VALUE.fullmatch(text):
            raise ValueError(f"marker value {key}={text!r} must be a plain token")
        parts.append(f"{key}={text}")
    return " ".join(parts)


def event(
    kind: str,
    *,
    host: str | None = None,
    catalogue: CompiledCatalogue | None = None,
    **values: object,
) -> Diagnosis:
    """The diagnosis fleet reports for its own event (same text as from the log marker)."""
    found = diagnose([marker(kind, **values)], host=host, catalogue=catalogue or load_catalogue())
    for d in found:
        if d.id == kind:
            return d
    raise AssertionError(f"catalogue does not recognise its own marker for {kind}")

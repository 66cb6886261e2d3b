"""Facts about hosts, pyinfra-style: each fact is a remote part plus a pure local parser.

One on-host script (``fleet/onhost/facts.py``, run by the host's Python, stdlib only,
never importing vLLM) gathers every raw observation in one round trip; the pure parsers of
:mod:`fleet.facts.parsers` turn them into :class:`HostFacts`. To add a fact: a ``part_*``
function there, a parser here, a field in :mod:`fleet.facts.models` (CONTRIBUTING.md).
"""

from fleet.facts.gather import gather_facts
from fleet.facts.models import (
    EAGLE3_CLASSES,
    DiskUsage,
    Eagle3Allowlist,
    Eagle3ClassInfo,
    GpuInfo,
    HostFacts,
    Supervisors,
    VllmFacts,
    VllmServer,
)
from fleet.facts.parsers import gpu_summary, parse_facts

__all__ = [
    "EAGLE3_CLASSES",
    "DiskUsage",
    "Eagle3Allowlist",
    "Eagle3ClassInfo",
    "GpuInfo",
    "HostFacts",
    "Supervisors",
    "VllmFacts",
    "VllmServer",
    "gather_facts",
    "gpu_summary",
    "parse_facts",
]

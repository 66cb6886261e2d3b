"""The vLLM versions under test: one list, and the subsets the tests draw from it with
fleet's own table of version families (``fleet/onhost/families.py``)."""

from __future__ import annotations

from fleet.onhost.families import EAGLE3_UPSTREAM, LOG_FAMILIES, log_family, version_tuple

# The first release of each shape the patch set handles, the first with EAGLE-3 upstream,
# and a recent one (wheels downloaded by name and cached: fleet.sandbox.vllm_source).
TESTED = ("0.10.2", "0.11.0", "0.13.0", "0.15.0", "0.16.0", "0.17.0", "0.18.0", "0.33.0")


def needs_patch(version: str) -> bool:
    return version_tuple(version)[:2] < EAGLE3_UPSTREAM


# the patch engine: every shape it edits, and the first release it leaves alone
PATCH_ENGINE = tuple(v for v in TESTED if version_tuple(v) <= (0, 18, 0))
PATCHED = tuple(v for v in PATCH_ENGINE if needs_patch(v))
# the releases that serve EAGLE-3 on DeepSeek/Kimi unpatched
UPSTREAM = tuple(v for v in TESTED if not needs_patch(v))
# the last release that needs the patch set and the first that does not
EAGLE3_BOUNDARY = (PATCHED[-1], UPSTREAM[0])
# Kimi-K2.5 (model_executor/models/kimi_k25.py) ships from this release on
# (docs/research/vllm-eagle3.md section 1): the patch set's Kimi edits start here
KIMI_K25_SINCE = (0, 15)
PATCHED_KIMI_K25 = tuple(v for v in PATCHED if version_tuple(v)[:2] >= KIMI_K25_SINCE)
# the phase tracker: the first and the last release tested of each log family
PHASES = {
    name: [vs[0], vs[-1]]
    for name, *_ in LOG_FAMILIES
    for vs in [[v for v in TESTED if log_family(v) == name]]
}
# the rehearsal vLLM's start-up, line by line against the wheel (recorded transcripts)
SIM_GOLDEN = ("0.15.1", "0.17.0", "0.18.0")
# one sandbox host per release for `fleet patch` end to end (six hosts)
PATCH_HOSTS = PATCH_ENGINE[1:]
# one release per log family (the family's own representative)
FAMILY_REPRESENTATIVES = tuple(tested for _name, _first, _end, tested in LOG_FAMILIES)
# the sandbox's hosts by default: the last patched family and the first upstream one
SANDBOX_DEFAULT = EAGLE3_BOUNDARY
# a server across hosts (fleet/serving/multinode.py): what a vLLM offers, read from its
# source -- the last release without vLLM's own multi-node mode and the first with it
# (--nnodes/--headless, 0.11.1), the last without VLLM_ENGINE_READY_TIMEOUT_S and the
# first with it (0.14.0), 0.17.0, and the first with --distributed-timeout-seconds (0.18.0)
MULTINODE_OFFERS = ("0.11.0", "0.11.1", "0.13.0", "0.14.0", "0.17.0", "0.18.0")
# the rehearsal vLLM's start across two nodes: one release per log family, the first of
# its family that has vLLM's multi-node mode (0.11.1 for <=0.14, whose representative is
# 0.13.0), the family's representative otherwise
MULTINODE_FAMILIES = ("0.11.1", *FAMILY_REPRESENTATIVES[1:])

# vLLM version families: the one table that the phase tracker (fleet/serving/phases.py),
# the rehearsal vLLM (fleet/onhost/rehearsal/vllm_sim_src.py), the patch-set manifests (a named
# range in `versions:`) and the tests (tests/versions.py) read. Shipped (stdlib only):
# the rehearsal vLLM reads it on the host.
#
# A log family is a run of releases whose start-up prints the same lines (format strings,
# process prefixes, the logo): docs/research/vllm-serve.md section 1.
from typing import Dict, Optional, Tuple

# name, first release (inclusive), end (exclusive), the release tests use for it
LOG_FAMILIES: Tuple[Tuple[str, Optional[Tuple[int, int]], Optional[Tuple[int, int]], str], ...] = (
    ("<=0.14", None, (0, 15), "0.13.0"),
    ("0.15-0.17", (0, 15), (0, 18), "0.17.0"),
    (">=0.18", (0, 18), None, "0.18.0"),
)
FAMILY_NAMES = tuple(f[0] for f in LOG_FAMILIES)
# A change inside a family, not a bound of one: from this release vLLM prefixes a worker
# "(Worker pid=W)" from its start (vllm/utils/system_utils.py); in 0.17 the rank's prefix
# at init_device nests inside it, from 0.18 (the next family) it replaces it.
WORKER_EARLY_PREFIX = (0, 17)

# DeepseekV2ForCausalLM (DeepSeek-V3, Kimi-K2) implements SupportsEagle3 upstream from this
# release: before it, fleet's eagle3-deepseek patch set is needed; from it, never applied.
EAGLE3_UPSTREAM = (0, 18)
# Named version ranges a patch-set manifest may give as its `versions:`.
RANGES: Dict[str, str] = {
    "eagle3-patch": ">=0.10.2,<%d.%d" % EAGLE3_UPSTREAM,
}


def version_tuple(version: str) -> Tuple[int, ...]:
    """(major, minor, patch) of a release string ("0.17.0", "0.15.1+cpu", "0.11.0rc1")."""
    out = []
    for part in version.split("+", 1)[0].split(".")[:3]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        out.append(int(digits or 0))
    while len(out) < 3:
        out.append(0)
    return tuple(out)


def log_family(version: str) -> str:
    """The log family of a release (unknown or newer: the newest family)."""
    v = version_tuple(version)[:2]
    for name, first, end, _tested in LOG_FAMILIES:
        if (first is None or v >= first) and (end is None or v < end):
            return name
    return LOG_FAMILIES[-1][0]

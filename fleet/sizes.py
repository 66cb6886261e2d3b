"""Byte sizes for people: the one formatter of fleet's output (``12.5 MiB``, ``179 GiB``).

Binary units (a GiB is 2**30 bytes), as ``nvidia-smi``, ``df -h`` and vLLM's own messages
count them. Each caller chooses its precision and units; the choice of unit is the same
everywhere: the largest that is at most ``n``, else the smallest offered.
"""

from __future__ import annotations

from collections.abc import Sequence

KiB = 2**10
MiB = 2**20
GiB = 2**30

SCALE: dict[str, int] = {"GiB": GiB, "MiB": MiB, "KiB": KiB, "B": 1}


def in_unit(n: float, unit: str, spec: str = ".2f") -> str:
    """``n`` bytes as a number of ``unit``, without the unit (``in_unit(3 * GiB, "GiB")``
    is ``"3.00"``): for a message whose template names the unit itself."""
    return format(n / SCALE[unit], spec)


def human_bytes(
    n: float, *, spec: str = ".1f", units: Sequence[str] = ("GiB", "MiB", "KiB", "B")
) -> str:
    """``n`` bytes in the largest of ``units`` that is at most ``n`` (the last one when
    none is): ``human_bytes(1536) == "1.5 KiB"``; whole bytes are never given a fraction
    (``human_bytes(12) == "12 B"``)."""
    chosen = next((u for u in units if SCALE[u] <= n), units[-1])
    if chosen == "B":
        return f"{int(n)} B"
    return f"{in_unit(n, chosen, spec)} {chosen}"

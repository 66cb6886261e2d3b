"""The one byte formatter (fleet.sizes) gives each caller the text it gave before."""

from __future__ import annotations

import pytest

from fleet.sizes import GiB, KiB, MiB, human_bytes, in_unit


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 * MiB, "5.0 MiB"), (3 * GiB, "3.0 GiB")],
)
def test_the_default_is_one_decimal_in_the_largest_unit_at_most_n(n: int, text: str) -> None:
    assert human_bytes(n) == text  # fleet logs: "fetched 1.5 KiB of 3.0 GiB"


def test_each_caller_keeps_its_own_precision_and_units() -> None:
    disk = ("GiB", "MiB")  # fleet inspect's disks
    assert human_bytes(500 * GiB, spec=".0f", units=disk) == "500 GiB"
    assert human_bytes(300 * MiB, spec=".0f", units=disk) == "300 MiB"
    assert human_bytes(KiB, spec=".0f", units=disk) == "0 MiB"  # the smallest offered
    # the GPU summary: 183359 MiB is "179 GiB"
    assert human_bytes(183359 * MiB, spec=".0f", units=("GiB",)) == "179 GiB"
    # the remote filter's note: "2 MiB", "512 B"
    assert human_bytes(2 * MiB, spec="g", units=("MiB", "B")) == "2 MiB"
    assert human_bytes(512, spec="g", units=("MiB", "B")) == "512 B"


def test_a_number_in_a_unit_for_a_template_that_names_it() -> None:
    assert in_unit(1240 * MiB, "GiB") == "1.21"  # vLLM's "(1.21/79.19 GiB)"
    assert in_unit(3 * GiB, "GiB", ".0f") == "3"

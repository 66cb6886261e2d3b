"""The one table of vLLM version families (fleet/onhost/families.py) and its readers."""

from __future__ import annotations

import pytest

from fleet.onhost.families import (
    EAGLE3_UPSTREAM,
    FAMILY_NAMES,
    RANGES,
    log_family,
    version_tuple,
)


@pytest.mark.parametrize(
    ("version", "family"),
    [("0.10.2", "<=0.14"), ("0.14.1", "<=0.14"), ("0.15.0", "0.15-0.17"),
     ("0.15.1+cpu", "0.15-0.17"), ("0.17.1", "0.15-0.17"), ("0.18.0", ">=0.18"),
     ("0.33.0", ">=0.18"), ("0.11.0rc1", "<=0.14"), ("1.0", ">=0.18")],
)  # fmt: skip
def test_each_release_has_its_family(version: str, family: str) -> None:
    assert log_family(version) == family


def test_version_tuples() -> None:
    assert version_tuple("0.15.1+cpu") == (0, 15, 1)
    assert version_tuple("0.11.0rc1") == (0, 11, 0)
    assert version_tuple("1") == (1, 0, 0)


def test_the_phase_tracker_and_the_manifest_read_the_table() -> None:
    from fleet.patching.manifest import load_patch_set
    from fleet.patching.versions import Version
    from fleet.serving.phases import FAMILIES, version_family

    assert FAMILIES == FAMILY_NAMES
    assert version_family("0.17.0") == log_family("0.17.0")
    manifest = load_patch_set().manifest
    assert manifest.versions == RANGES["eagle3-patch"]  # named in the manifest, resolved
    assert manifest.upstream_since is not None
    assert version_tuple(manifest.upstream_since)[:2] == EAGLE3_UPSTREAM
    rng = manifest.version_range
    assert Version("0.17.1") in rng and Version("0.18.0") not in rng

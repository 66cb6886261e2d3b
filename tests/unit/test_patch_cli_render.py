"""The one-word summary per host in `fleet patch`'s table (pure)."""

from __future__ import annotations

import pytest

from fleet.cli.cmd_patch import host_status
from fleet.patching.service import FileReport, HostReport


def report(*statuses: str) -> HostReport:
    files = [
        FileReport(path=f"f{i}.py", status=s, sha256_before=None, sha256_after=None)  # type: ignore[arg-type]
        for i, s in enumerate(statuses)
    ]
    return HostReport(
        host="h",
        patch_set="p",
        mode="apply",
        vllm_version="0.17.0",
        package_dir="/x",
        files=files,
        ok=True,
    )


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (("not-needed", "not-needed"), "not-needed"),
        (("applied", "not-needed"), "applied"),
        (("already-applied", "applied"), "applied"),
        (("already-applied", "not-needed"), "already-applied"),
        (("would-apply", "already-applied"), "would-apply"),
        (("applied", "conflict"), "conflict"),
        (("reverted", "not-needed"), "reverted"),
        ((), "not-needed"),
    ],
)
def test_host_status_is_the_worst_file_status(statuses: tuple[str, ...], expected: str) -> None:
    assert host_status(report(*statuses)) == expected

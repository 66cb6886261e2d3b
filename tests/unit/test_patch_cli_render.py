"""`fleet patch` output: the one-word summary per host, the table and lines for people
(host strings are text, not markup), and the --json entry of a failed host."""

from __future__ import annotations

import io
import json

import pytest

from fleet.cli.cmd_patch import _emit, _render
from fleet.patching.apply import FileReport, HostReport
from fleet.patching.engine import Candidate, Conflict
from fleet.transport import HostOutcome


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
    assert report(*statuses).status == expected


# -- what `fleet patch` prints: host strings are text, never rich markup -------------------

HOSTILE = "[/x]"  # closes a tag that was never opened: rich raises MarkupError on it


def _outcomes() -> list[HostOutcome[HostReport]]:
    ok = HostReport(
        host=f"{HOSTILE}ok",
        patch_set="p",
        mode="apply",
        vllm_version=f"0.17.0{HOSTILE}[bold]",
        package_dir=f"/site/{HOSTILE}/vllm",
        files=[
            FileReport(
                path=f"models/{HOSTILE}a.py",
                status="applied",
                sha256_before="a" * 64,
                sha256_after="b" * 64,
                note=f"note {HOSTILE}",
                diff=f"--- a/{HOSTILE}\n+++ b/{HOSTILE}\n@@ -1 +1 @@\n-x\n+y\n",
            ),
            FileReport(
                path=f"models/{HOSTILE}b.py",
                status="conflict",
                sha256_before="c" * 64,
                sha256_after="c" * 64,
                note=f"[bold]{HOSTILE}",
                conflict=Conflict(
                    f"models/{HOSTILE}b.py",
                    f"anchor not found {HOSTILE}",
                    candidates=[Candidate(3, f"    for [bold]x{HOSTILE} in y:", 0.9)],
                ),
            ),
        ],
        ok=False,
        backup_dir=f"/home/u/.fleet/{HOSTILE}",
    )
    return [
        HostOutcome(ok.host, "ok", value=ok),
        HostOutcome(
            f"[bold]{HOSTILE}bad\\",
            "failed",
            error=f"the patch script failed: [bold]{HOSTILE}",
            hint=f"next {HOSTILE}",
        ),
    ]


@pytest.mark.parametrize("verbose", [False, True])
def test_hostile_strings_are_printed_as_text(verbose: bool) -> None:
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=300, highlight=False, soft_wrap=False, color_system=None)
    _render(console, _outcomes(), f"p{HOSTILE}", True, False, False, verbose=verbose)
    out = buf.getvalue()
    assert f"fleet patch p{HOSTILE}: apply" in out
    assert f"0.17.0{HOSTILE}[bold]" in out  # the version, verbatim
    assert f"[bold]{HOSTILE}bad\\: the patch script failed: [bold]{HOSTILE}" in out
    assert f"next {HOSTILE}" in out
    assert f"{HOSTILE}ok: conflict: models/{HOSTILE}b.py: anchor not found {HOSTILE}" in out
    assert f"models/{HOSTILE}b.py:3: for [bold]x{HOSTILE} in y:" in out
    assert f"nothing was written on {HOSTILE}ok" in out
    assert f"originals kept in /home/u/.fleet/{HOSTILE}" in out
    assert f"{HOSTILE}ok: models/{HOSTILE}a.py" in out  # the rule above the diff
    if verbose:
        assert f"vLLM 0.17.0{HOSTILE}[bold] /site/{HOSTILE}/vllm" in out
        assert f"note {HOSTILE}" in out and f"[bold]{HOSTILE}" in out
        assert f"models/{HOSTILE}a.py  aaaaaaaaaaaa -> bbbbbbbbbbbb" in out


def test_a_failed_host_has_every_field_of_the_json_contract(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _emit(_outcomes(), show_diff=False)
    doc = json.loads(capsys.readouterr().out)["hosts"]
    for entry in doc.values():
        assert {"vllm_version", "files", "ok"} <= set(entry)
    failed = doc[f"[bold]{HOSTILE}bad\\"]
    assert failed["ok"] is False and failed["vllm_version"] is None and failed["files"] == []
    assert failed["status"] == "failed" and failed["error"].endswith(HOSTILE)

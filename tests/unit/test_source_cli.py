"""``fleet source`` usage errors: one line, exit 2, before any connection is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.cli import cli
from fleet.cli.errors import run_cli


@pytest.fixture()
def inventory(tmp_path: Path) -> Path:
    # port 1 on loopback: any attempt to connect would fail with exit 3, not 2
    path = tmp_path / "inventory.yaml"
    path.write_text("all:\n  hosts:\n    h1: {address: 127.0.0.1, port: 1}\n")
    return path


@pytest.mark.parametrize(
    "args",
    [
        ["source", "show", "--host", "h1", "/etc/passwd"],
        ["source", "show", "--host", "h1", "../../etc/passwd:1-5"],
        ["source", "show", "--host", "h1", "model_executor/../../x.py"],
        ["source", "show", "--host", "h1", "a.py:9-3"],
        ["source", "grep", "--host", "h1", "x", "/etc"],
        ["source", "grep", "--host", "h1", "x", "a/../.."],
        ["source", "grep", "--host", "h1", "("],
        ["source", "show", "--host", "nope", "a.py"],
    ],
)
def test_usage_errors(args: list[str], inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(cli, ["--inventory", str(inventory), *args])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet: error: ")
    assert "Traceback" not in captured.err


def test_unreachable_is_exit_3(
    inventory: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_CONNECT_ATTEMPTS", "1")
    code = run_cli(cli, ["--inventory", str(inventory), "source", "show", "--host", "h1", "a.py"])
    assert code == 3
    assert "h1: cannot connect to 127.0.0.1:1" in capsys.readouterr().err


def test_host_strings_are_printed_literally(capsys: pytest.CaptureFixture[str]) -> None:
    """Host names, paths, lines and errors are printed as they are (never as markup)."""
    from fleet.cli.cmd_source import _finish, _print_shown
    from fleet.cli.context import AppContext
    from fleet.source import ShownFile
    from fleet.transport import HostOutcome

    shown = ShownFile(
        vllm_dir="/v",
        file="/v/[/p].py",
        path="[/p].py",
        total_lines=2,
        start=1,
        lines=[(1, "x = '[/bold]'\\"), (2, "[red]y")],
    )
    _print_shown([HostOutcome("[/x]", "ok", value=shown)], "[/p].py", raw=False)
    _finish(
        AppContext("inventory.yaml"),
        [HostOutcome("[/down]", "failed", error="[/red] boom", hint="[/dim]", exit=1)],
    )
    captured = capsys.readouterr()
    assert "==> [/x]: [/p].py:1-2 <==" in captured.out
    assert "1  x = '[/bold]'\\" in captured.out and "2  [red]y" in captured.out
    assert "[/down]: [/red] boom" in captured.err and "next: [/dim]" in captured.err

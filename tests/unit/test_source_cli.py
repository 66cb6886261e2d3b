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
def test_usage_errors(
    args: list[str], inventory: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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
    assert "h1: unreachable:" in capsys.readouterr().err

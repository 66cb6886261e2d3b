"""What every fleet run shares: the version, -vv logging of remote commands."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

import fleet
from fleet.cli import cli
from fleet.cli.errors import run_cli
from fleet.inventory import HostSpec
from fleet.transport import LocalRunner, shell

ROOT = Path(__file__).resolve().parents[2]


def test_version_from_the_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(cli, ["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"fleet, version {fleet.__version__}"


def test_version_from_a_checkout_without_install(tmp_path: Path) -> None:
    """``python -m fleet --version`` in the source tree, with no installed distribution
    on the path (only the checkout and the dependencies of this environment)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from fleet.cli import main; sys.argv[1:] = ['--version']; main()",
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0 and fleet.__version__ in proc.stdout, proc.stderr
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "vllm-fleet" and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["hatch"]["version"]["path"] == "fleet/__init__.py"


def test_every_remote_command_is_logged_masked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="fleet")
    conn = LocalRunner(HostSpec(name="h7", python=sys.executable))
    secret = "sk-abcdefghijklmnop0123"
    conn.run(shell.join(["sh", "-c", "printf hello; exit 3", "--api-key", secret]))
    records = [r.getMessage() for r in caplog.records if r.name == "fleet.transport.runner"]
    assert len(records) == 1
    line = records[0]
    assert line.startswith("h7: exit 3 in ") and " 5 bytes: " in line
    assert secret not in line and "***" in line

"""Running an on-host bundle for real in the tests: this interpreter as the host's Python
(``python -``: the bundle's loader, its byte-code cache under ``$HOME``), one request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from fleet.onhost import client


def run_bundle(
    script: str, request: dict[str, Any], *, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``fleet/onhost/<script>.py`` bundled with ``request`` and run (exit 0 required)."""
    return subprocess.run(
        [sys.executable, "-"],
        input=client.with_request(script, request),
        capture_output=True,
        env=env,
        cwd=cwd,
        check=True,
    )


def answer(proc: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    """The answer envelope of a run (it must have one)."""
    doc, _rest = client.split_answer(proc.stdout)
    assert doc is not None, proc.stderr[-2000:]
    return doc

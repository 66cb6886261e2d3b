"""Wheels fleet needs on the control machine, downloaded by name with pip and cached.

``fleet.paths.cache_dir()/wheels/`` holds them (``$FLEET_CACHE`` overrides): the vLLM
wheels the sandbox unpacks, and the supervisor wheel ``fleet serve`` pushes to hosts that
have no supervisord (so hosts need no package index).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fleet.errors import OperationFailed
from fleet.localfiles import locked
from fleet.paths import cache_dir

SUPERVISOR = "supervisor==4.3.0"


def _find(wheels: Path, name: str, version: str) -> Path | None:
    found = sorted(wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    found += sorted(wheels.glob(f"{name}-{version}-*.whl"))
    return found[0] if found else None


def wheel(requirement: str) -> Path:
    """The cached wheel of ``name==version``, downloaded with pip (no dependencies) if
    missing."""
    name, sep, version = requirement.partition("==")
    if not sep or not name or not version:
        raise ValueError(f"a pinned requirement is needed (name==version), got {requirement!r}")
    wheels = cache_dir() / "wheels"
    with locked(cache_dir() / "locks" / f"wheel-{name}-{version}.lock"):
        found = _find(wheels, name, version)
        if found:
            return found
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-cache-dir",
            "--only-binary=:all:", "--dest", str(wheels), requirement,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        found = _find(wheels, name, version)
        if proc.returncode != 0 or not found:
            raise OperationFailed(
                f"could not download {requirement} with pip: {pip_error(proc.stderr)}"
            )
        return found


def pip_error(stderr: str) -> str:
    """The line of pip's output that says what went wrong: its last ``ERROR:`` line (not
    the caret under a requirement, nor the list of versions before it)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["no output"])[-1]


def supervisor_wheel() -> Path:
    return wheel(SUPERVISOR)

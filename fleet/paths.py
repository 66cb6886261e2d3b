"""Where fleet's data files live, in a checkout and in an installed wheel."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    checkout = _PKG.parent / name
    if checkout.is_dir():
        return checkout
    return _PKG / "_data" / name


def templates_dir() -> Path:
    """The top-level ``templates/`` directory (Jinja2 patch sets, units, launch scripts)."""
    return _data_dir("templates")


def playbooks_dir() -> Path:
    """The top-level ``playbooks/`` directory (serve profiles)."""
    return _data_dir("playbooks")


def cache_dir() -> Path:
    """fleet's cache (downloaded vLLM wheels, unpacked trees); ``$FLEET_CACHE`` overrides."""
    import os

    env = os.environ.get("FLEET_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleet"

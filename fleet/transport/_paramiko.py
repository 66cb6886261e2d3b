"""paramiko, imported without Invoke (done first by ``fleet.transport``).

paramiko's ``config`` module imports Invoke whenever it is installed (fleet has it, for
Fabric), only to run the ``Match exec`` lines of an ssh_config; with it come
``unittest.mock`` and ``asyncio``: about a third of the start-up of ``fleet inspect``
(see benchmarks/peers.py). Here paramiko is imported with Invoke hidden, and its config
module is given a stand-in that imports Invoke on first use, so ``Match exec`` works as
before and a run that never meets one (or never needs Fabric) never pays for Invoke.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any


class _InvokeOnFirstUse:
    """Stands for the ``invoke`` module in ``paramiko.config`` until it is used."""

    def __getattr__(self, name: str) -> Any:
        module = importlib.import_module("invoke")
        config = sys.modules.get("paramiko.config")
        if config is not None:
            config.invoke = module  # type: ignore[attr-defined]
        return getattr(module, name)


def import_paramiko() -> ModuleType:
    if "paramiko" in sys.modules or "invoke" in sys.modules:
        return importlib.import_module("paramiko")
    try:
        present = importlib.util.find_spec("invoke") is not None
    except (ImportError, ValueError):
        present = False
    if not present:
        return importlib.import_module("paramiko")
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` fails at once
    try:
        module = importlib.import_module("paramiko")
    finally:
        if sys.modules.get("invoke", 0) is None:
            del sys.modules["invoke"]
    config = sys.modules["paramiko.config"]
    if getattr(config, "invoke", None) is None:
        config.invoke = _InvokeOnFirstUse()  # type: ignore[attr-defined]
        config.invoke_import_error = None  # type: ignore[attr-defined]
    return module


import_paramiko()

"""Output helpers: rich for people, JSON for programs (``--json`` puts only JSON on stdout)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

_console: Console | None = None
_err_console: Console | None = None


def console() -> Console:
    """The rich console for human output on stdout."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(highlight=False, soft_wrap=False)
    return _console


def err_console() -> Console:
    """The rich console on stderr: progress, warnings, hints (never mixed into --json)."""
    global _err_console
    if _err_console is None:
        from rich.console import Console

        _err_console = Console(stderr=True, highlight=False)
    return _err_console


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout (pydantic models are dumped in JSON mode)."""
    from pydantic import BaseModel

    def default(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        if isinstance(value, set | frozenset):
            return sorted(value)
        return str(value)

    sys.stdout.write(json.dumps(obj, indent=2, default=default, sort_keys=False) + "\n")
    sys.stdout.flush()

"""Output helpers: rich for people, JSON for programs (``--json`` puts only JSON on stdout)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.transport import HostOutcome

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


def hosts_json(
    outcomes: Sequence[HostOutcome[Any]], ok_body: Callable[[Any], dict[str, Any]]
) -> dict[str, Any]:
    """``{"hosts": {name: {"ok": true, **ok_body(value)} | {"ok": false, "status", "error"}}}``."""
    out: dict[str, Any] = {}
    for o in outcomes:
        if o.ok and o.value is not None:
            out[o.host] = {"ok": True, **ok_body(o.value)}
        else:
            out[o.host] = o.failure_json()
    return {"hosts": out}


STATUS_STYLE = {"ok": "green", "failed": "red", "unreachable": "bold red"}


def print_outcomes(
    outcomes: Sequence[HostOutcome[Any]],
    columns: list[str],
    cells: Callable[[Any], list[str]],
    title: str | None = None,
) -> None:
    """The per-host summary for people: a table (host, status, the command's columns),
    then one line per failed host with its error and what to do next. ``cells`` returns
    rich markup: escape any text that comes from a host."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("host", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col in columns:
        table.add_column(col)
    for o in outcomes:
        status = f"[{STATUS_STYLE[o.status]}]{o.status}[/]"
        if o.ok and o.value is not None:
            table.add_row(escape(o.host), status, *cells(o.value))
        else:
            table.add_row(escape(o.host), status, *(["-"] * len(columns)))
    ok = sum(o.ok for o in outcomes)
    table.caption = f"{ok}/{len(outcomes)} ok"
    out = console()
    out.print(table)
    for o in outcomes:
        if not o.ok:
            out.print(
                f"[{STATUS_STYLE[o.status]}]{escape(o.host)}[/]: {escape(o.error or '')}",
                soft_wrap=True,
            )
            if o.hint:
                out.print(f"  [dim]next:[/] {escape(o.hint)}", soft_wrap=True)

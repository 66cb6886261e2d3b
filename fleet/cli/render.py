"""Output for people (rich) and programs (``--json``): the one renderer of per-host results.

Every function that prints takes the console it prints to (the run's ``AppContext``
creates it; tests pass their own). Text that comes from a host or a user is escaped: it
is never rich markup.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.transport import HostOutcome

STATUS_STYLE = {
    "ok": "green",
    "changed": "bold green",
    "failed": "red",
    "unreachable": "bold red",
    "refused": "yellow",
}


PIPE_WIDTH = 160


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (results) or stderr (progress, warnings, hints). Output that
    is not a terminal (a pipe, a file, CI) gets tables 160 columns wide unless $COLUMNS
    says otherwise, rather than rich's 80."""
    import os

    from rich.console import Console

    console = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPE_WIDTH
    return console


def escape(text: object) -> str:
    from rich.markup import escape as _escape

    return _escape(str(text))


def styled_status(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'red')}]{escape(status)}[/]"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with control characters (ANSI escapes, carriage returns, bells...) shown as
    ``\\xNN``: text from a host must not move the cursor or recolour the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


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


def emit_json_line(obj: Any) -> None:
    """One JSON object on one line (``--events``, ``--follow --json``)."""
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def failure_lines(console: Console, outcomes: Sequence[HostOutcome[Any]]) -> None:
    """One line per host that did not succeed, ``host: error``, and its ``next:`` hint
    (an error quotes host output or user input: control characters shown as ``\\xNN``)."""
    for o in outcomes:
        if o.ok:
            continue
        console.print(
            f"[{STATUS_STYLE.get(o.status, 'red')}]{escape(terminal_safe(o.host))}[/]: "
            f"{escape(terminal_safe(o.error or o.status))}",
            soft_wrap=True,
        )
        if o.hint:
            console.print(f"  [dim]next:[/] {escape(terminal_safe(o.hint))}", soft_wrap=True)


def host_table(
    console: Console,
    outcomes: Sequence[HostOutcome[Any]],
    columns: list[str],
    cells: Callable[[Any], list[str]],
    title: str | None = None,
) -> None:
    """The per-host summary for people: a table (host, status, the command's columns),
    then :func:`failure_lines`. ``cells`` returns rich markup: escape host text in it."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("host", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col in columns:
        table.add_column(col)
    for o in outcomes:
        if o.value is not None:
            table.add_row(escape(o.host), styled_status(o.status), *cells(o.value))
        else:
            table.add_row(escape(o.host), styled_status(o.status), *(["-"] * len(columns)))
    ok = sum(o.ok for o in outcomes)
    table.caption = f"{ok}/{len(outcomes)} ok"
    console.print(table)
    failure_lines(console, outcomes)

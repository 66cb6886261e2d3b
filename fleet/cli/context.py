"""State shared by every subcommand of one ``fleet`` run, and the common options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from fleet.inventory import HostSpec, Inventory
    from fleet.transport import Session

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class AppContext:
    inventory_path: str
    json_output: bool = False
    verbose: int = 0
    forks: int = 32
    _inventory: Inventory | None = field(default=None, repr=False)

    def inventory(self) -> Inventory:
        if self._inventory is None:
            from fleet.inventory import load_inventory

            self._inventory = load_inventory(self.inventory_path)
        return self._inventory

    def select(self, patterns: tuple[str, ...] | list[str]) -> list[HostSpec]:
        """Hosts matching ``--host`` patterns (name, group, glob, ``all``); exit 2 if none."""
        return self.inventory().select(list(patterns))

    def session(self) -> Session:
        """A run-scoped transport session: one SSH connection per host, closed at exit."""
        from fleet.transport import Session

        session = Session(self.inventory())
        click.get_current_context().call_on_close(session.close)
        return session


def host_option(required: bool = True) -> Callable[[F], F]:
    """``--host PATTERN`` (repeatable): a host name, a group, a glob or ``all``."""
    return click.option(
        "--host",
        "hosts",
        multiple=True,
        required=required,
        metavar="PATTERN",
        help="Host name, group name, glob or 'all' (repeatable).",
    )


pass_app = click.make_pass_decorator(AppContext)

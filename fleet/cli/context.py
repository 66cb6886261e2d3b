"""State shared by every subcommand of one ``fleet`` run, and the common options."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.inventory import HostSpec, Inventory
    from fleet.transport import HostOutcome, Session

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

LOG_FORMAT = "fleet: %(levelname)s %(name)s: %(message)s"


def setup_logging(verbose: int) -> None:
    """``-v`` logs what a long run meets on stderr: each step of a serve, connections lost
    and re-established (and after how long), the follow resumed at its byte, what a remote
    log filter moved. ``-vv`` adds every remote command (masked) with host, exit code,
    duration and bytes, the patch plans kept or made, the traceback of a host's
    unexpected exception, and paramiko's own records (INFO and up: handshakes, a port that
    does not speak SSH...). Without ``-vv`` nothing of paramiko's reaches stderr: each
    failure is one line for its host."""
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    if verbose < 1:
        return
    wanted = [("fleet", logging.INFO)]
    if verbose >= 2:
        wanted = [("fleet", logging.DEBUG), ("paramiko", logging.INFO)]
    for name, level in wanted:
        logger = logging.getLogger(name)
        if not any(getattr(h, "_fleet", False) for h in logger.handlers):
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            handler._fleet = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
        logger.setLevel(level)


@dataclass
class AppContext:
    inventory_path: str
    json_output: bool = False
    verbose: int = 0
    forks: int = 32
    raw: bool = False
    """Print text from hosts as it is (``--raw``); by default control characters are
    shown as ``\\xNN``."""
    _inventory: Inventory | None = field(default=None, repr=False)
    _console: Console | None = field(default=None, repr=False)
    _err_console: Console | None = field(default=None, repr=False)

    @property
    def console(self) -> Console:
        """Where results for people go (stdout)."""
        if self._console is None:
            from fleet.cli.render import make_console

            self._console = make_console()
        return self._console

    @property
    def err_console(self) -> Console:
        """Progress, warnings and hints (stderr; never mixed into ``--json``)."""
        if self._err_console is None:
            from fleet.cli.render import make_console

            self._err_console = make_console(stderr=True)
        return self._err_console

    def inventory(self) -> Inventory:
        if self._inventory is None:
            from fleet.inventory import load_inventory

            self._inventory = load_inventory(self.inventory_path)
        return self._inventory

    def select(self, patterns: tuple[str, ...] | list[str]) -> list[HostSpec]:
        """Hosts matching ``--host`` patterns (name, group, glob, ``all``); exit 2 if none."""
        return self.inventory().select(list(patterns))

    def fan_out(
        self, hosts: list[HostSpec], fn: Callable[[Any], T], session: Session | None = None
    ) -> list[HostOutcome[T]]:
        """``fleet.transport.fan_out`` with the run's session and ``--forks``; a run in
        which every host was refused for bad input is one usage error (exit 2)."""
        from fleet.transport import fan_out, raise_if_all_bad_input

        outcomes = fan_out(session or self.session(), hosts, fn, forks=self.forks)
        raise_if_all_bad_input(outcomes)
        return outcomes

    def map_hosts(
        self, hosts: list[HostSpec], fn: Callable[[HostSpec], T], session: Session
    ) -> list[HostOutcome[T]]:
        """``fleet.transport.map_hosts`` (no login: e.g. fetching host keys) likewise."""
        from fleet.transport import map_hosts, raise_if_all_bad_input

        outcomes = map_hosts(hosts, fn, forks=self.forks, on_interrupt=session.close)
        raise_if_all_bad_input(outcomes)
        return outcomes

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


class Seconds(click.FloatRange):
    """A duration in seconds, ``min`` up to a week: ``nan`` and ``inf`` (which pass a plain
    FloatRange, nan compares false with both bounds) are bad input at parse time."""

    name = "seconds"

    def __init__(self, min: float = 1.0, max: float = 7 * 86400.0) -> None:
        super().__init__(min=min, max=max)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number

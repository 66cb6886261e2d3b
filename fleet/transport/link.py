"""One host's connection for a long operation (``fleet serve``): the owner every step asks.

A serve lives for the 40-minute load and beyond: preflight, launch, the log follow,
readiness, metrics, the diagnosis of a crash. Each step asks the :class:`HostLink` for the
host's live connection (:meth:`HostLink.conn`) and runs through :meth:`HostLink.call`: when
the connection drops under a step (``ConnectionLost``), or cannot be opened again for a
moment (the host's sshd refuses, times out, is paused), the link opens a new one through
the run's :class:`~fleet.transport.Session` with exponential backoff (tenacity) until the
operation's deadline, and the step runs again on it. A step is run again only when it is
safe to (reads, or writes made idempotent on the host, such as a launch carrying its
launch id). Faults that waiting cannot mend (authentication, host keys, DNS) end the
operation at once.

Every reconnect is logged (``-v``) and counted per step (:attr:`HostLink.stats`), so a
serve's JSON says which steps met a cut.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from fleet.errors import ConnectError

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.transport.runner import Runner
    from fleet.transport.session import Session

log = logging.getLogger(__name__)
T = TypeVar("T")

# ConnectError codes that a wait can mend: the connection dropped, or the host's sshd is
# (for now) refusing, slow to answer or unreachable. Host keys, authentication and DNS are
# answers, not faults: they are never retried.
TRANSIENT_CODES = frozenset(
    {"connection-lost", "connect-refused", "connect-timeout", "unreachable", "bastion-failed"}
)
BACKOFF_MAX_S = 5.0


def transient(exc: BaseException) -> bool:
    """Is ``exc`` a connection fault that a reconnect may mend?"""
    return isinstance(exc, ConnectError) and exc.code in TRANSIENT_CODES


@dataclass
class LinkStats:
    """What the link met: reconnects in all, per step, and how long the host was away."""

    reconnects: int = 0
    by_step: dict[str, int] = field(default_factory=dict)
    away_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "reconnects": self.reconnects,
            "by_step": dict(self.by_step),
            "away_s": round(self.away_s, 1),
        }


class HostLink:
    """The owner of one host's connection for one operation (see the module docstring).

    ``deadline`` is a :func:`time.monotonic` time (the load budget's end): reconnects are
    tried until then; ``None`` allows ``reconnect_s`` seconds from each drop."""

    def __init__(
        self,
        session: Session,
        host: HostSpec,
        *,
        deadline: float | None = None,
        reconnect_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.host = host
        self.deadline = deadline
        self.reconnect_s = reconnect_s
        self.clock = clock
        self.stats = LinkStats()

    # -- the connection ---------------------------------------------------------------------
    def conn(self) -> Runner:
        """The host's live connection: the session's, or a new one when it is dead."""
        conn = self.session.connect(self.host)
        alive = getattr(conn, "transport_alive", None)
        if alive is not None and not alive():
            return self.reconnect("connection")
        return conn

    def connect(self, host: HostSpec) -> Runner:
        """:meth:`conn` in the shape of :class:`~fleet.transport.follow.Connects`."""
        return self.conn()

    def reconnect(self, step: str = "follow", host: HostSpec | None = None) -> Runner:
        """A new connection in place of the lost one, retried with exponential backoff
        until the deadline; the last fault is raised when it passes."""
        from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

        self.stats.reconnects += 1
        self.stats.by_step[step] = self.stats.by_step.get(step, 0) + 1
        started = self.clock()
        budget = self._budget(started)
        log.info("%s: connection lost during %s: reconnecting (%.0fs left)", self.host.name,
                 step, budget)  # fmt: skip
        attempts = 0

        def attempt() -> Runner:
            nonlocal attempts
            attempts += 1
            return self.session.reconnect(self.host)

        retrying = Retrying(
            stop=stop_after_delay(max(0.0, budget)),
            wait=wait_exponential(multiplier=0.25, max=BACKOFF_MAX_S),
            retry=retry_if_exception(transient),
            reraise=True,
        )
        try:
            conn = retrying(attempt)
        finally:
            self.stats.away_s += self.clock() - started
        log.info("%s: reconnected after %.1fs (%d attempts), %s resumes", self.host.name,
                 self.clock() - started, attempts, step)  # fmt: skip
        return conn

    def _budget(self, now: float) -> float:
        if self.deadline is None:
            return self.reconnect_s
        return self.deadline - now

    # -- steps ------------------------------------------------------------------------------
    def call(self, step: str, fn: Callable[[Runner], T]) -> T:
        """``fn(conn)`` on the live connection; run again on a new connection when the
        connection drops under it, until the deadline. ``fn`` must be safe to repeat."""
        while True:
            conn = self.conn()
            try:
                return fn(conn)
            except ConnectError as exc:
                if not transient(exc) or self._budget(self.clock()) <= 0:
                    raise
                log.debug("%s: %s: %s", self.host.name, step, exc.message)
                self.reconnect(step)

"""A bounded parallel map over hosts, returning one :class:`HostOutcome` per host.

One failing host never hides the others. Ctrl-C closes every connection (which unblocks
the workers) and re-raises. :func:`fan_out` connects first (the function gets the host's
open connection); :func:`map_hosts` hands the function the inventory entry (``trust``
fetches keys without logging in).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, TypeVar

from fleet.transport.outcome import HostOutcome, exit_code, hosts_json
from fleet.transport.wake import WAKE_S

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.transport.connection import HostConnection
    from fleet.transport.session import Session

log = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_FORKS = 32

__all__ = ["DEFAULT_FORKS", "HostOutcome", "exit_code", "fan_out", "hosts_json", "map_hosts"]


def _one(host: HostSpec, fn: Callable[[HostSpec], T]) -> HostOutcome[T]:
    try:
        value = fn(host)
    except Exception as exc:  # one host's bug or fault must not hide the others
        outcome: HostOutcome[T] = HostOutcome.of_error(host.name, exc)
        if outcome.code == "internal-error":
            log.debug("%s: unexpected exception", host.name, exc_info=exc)
        else:
            log.debug("%s: %s (%s)", host.name, outcome.error, outcome.code)
        return outcome
    return HostOutcome.of_value(host.name, value)


def map_hosts(
    hosts: Sequence[HostSpec],
    fn: Callable[[HostSpec], T],
    *,
    forks: int = DEFAULT_FORKS,
    on_done: Callable[[HostOutcome[T]], None] | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> list[HostOutcome[T]]:
    """Run ``fn(host)`` for every host, at most ``forks`` at once; results in host order."""
    if not hosts:
        return []
    results: dict[str, HostOutcome[T]] = {}
    pool = ThreadPoolExecutor(
        max_workers=max(1, min(forks, len(hosts))), thread_name_prefix="fleet-host"
    )
    order: dict[Future[HostOutcome[T]], int] = {}
    try:
        for index, host in enumerate(hosts):
            order[pool.submit(_one, host, fn)] = index
        pending = set(order)
        while pending:
            # bounded steps: a Ctrl-C that lands in a worker thread stops the map at once
            done, pending = wait(pending, timeout=WAKE_S, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=order.__getitem__):
                outcome = future.result()
                results[outcome.host] = outcome
                if on_done is not None:
                    on_done(outcome)
        pool.shutdown(wait=True)
    except KeyboardInterrupt:
        # wherever it lands (even after the last host): the connections are closed (the
        # hosts end what fleet started) and the run is reported as interrupted
        pool.shutdown(wait=False, cancel_futures=True)
        if on_interrupt is not None:
            on_interrupt()
        raise
    return [results[h.name] for h in hosts]


def fan_out(
    session: Session,
    hosts: Sequence[HostSpec],
    fn: Callable[[HostConnection], T],
    *,
    forks: int = DEFAULT_FORKS,
    on_done: Callable[[HostOutcome[T]], None] | None = None,
) -> list[HostOutcome[T]]:
    """Connect to every host (through ``session``: one connection per host per run) and
    run ``fn(conn)``, at most ``forks`` at once; results in host order."""

    def connected(host: HostSpec) -> T:
        return fn(session.connect(host))

    return map_hosts(hosts, connected, forks=forks, on_done=on_done, on_interrupt=session.close)

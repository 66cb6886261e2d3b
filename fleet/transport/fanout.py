"""A bounded parallel map over hosts, returning one outcome per host.

One failing host never hides the others. Ctrl-C closes every connection (which unblocks
the workers) and re-raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from fleet.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, ConnectError, FleetError

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.transport.connection import HostConnection
    from fleet.transport.session import Session

T = TypeVar("T")
Status = Literal["ok", "failed", "unreachable"]


@dataclass
class HostOutcome(Generic[T]):
    host: str
    status: Status
    value: T | None = None
    error: str | None = None
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def failure_json(self) -> dict[str, Any]:
        """The ``--json`` entry of a host that did not succeed."""
        entry: dict[str, Any] = {"ok": False, "status": self.status, "error": self.error}
        if self.hint:
            entry["hint"] = self.hint
        return entry


def _one(session: Session, host: HostSpec, fn: Callable[[HostConnection], T]) -> HostOutcome[T]:
    try:
        conn = session.connect(host)
        return HostOutcome(host.name, "ok", value=fn(conn))
    except ConnectError as exc:
        return HostOutcome(
            host.name, "unreachable", error=_strip(exc.message, host.name), hint=exc.hint
        )
    except FleetError as exc:
        return HostOutcome(host.name, "failed", error=_strip(exc.message, host.name), hint=exc.hint)
    except Exception as exc:  # one host's bug or fault must not hide the others
        return HostOutcome(host.name, "failed", error=f"{type(exc).__name__}: {exc}")


def _strip(message: str, host: str) -> str:
    prefix = f"{host}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


def fan_out(
    session: Session,
    hosts: Sequence[HostSpec],
    fn: Callable[[HostConnection], T],
    *,
    forks: int = 32,
    on_done: Callable[[HostOutcome[T]], None] | None = None,
) -> list[HostOutcome[T]]:
    """Run ``fn(conn)`` on every host, at most ``forks`` at once; results in host order."""
    if not hosts:
        return []
    results: dict[str, HostOutcome[T]] = {}
    pool = ThreadPoolExecutor(
        max_workers=max(1, min(forks, len(hosts))), thread_name_prefix="fleet-host"
    )
    futures: dict[Future[HostOutcome[T]], HostSpec] = {}
    try:
        for host in hosts:
            futures[pool.submit(_one, session, host, fn)] = host
        for future in as_completed(futures):
            outcome = future.result()
            results[outcome.host] = outcome
            if on_done is not None:
                on_done(outcome)
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        session.close()
        raise
    pool.shutdown(wait=True)
    return [results[h.name] for h in hosts]


def exit_code(outcomes: Sequence[HostOutcome[Any]]) -> int:
    """3 if any host was unreachable, else 1 if any failed, else 0."""
    if any(o.status == "unreachable" for o in outcomes):
        return EXIT_UNREACHABLE
    if any(o.status == "failed" for o in outcomes):
        return EXIT_FAILED
    return EXIT_OK

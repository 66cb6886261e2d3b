"""How each host ended: one result type for every command, its exit code and its JSON.

A host's :class:`HostOutcome` has one of five statuses:

    ok           the operation succeeded and changed nothing
    changed      the operation succeeded and changed the host (patch applied, server started)
    failed       the operation ran and failed (exit 1)
    unreachable  fleet could not connect or authenticate (exit 3)
    refused      the host was not acted on: bad input for it (exit 2, e.g. a path that
                 leaves the vLLM tree) or a refusal of the operation (exit 1, e.g. serve's
                 preflight)

plus a stable ``code`` (``fleet.errors.CODES``), the error line and its "next:" hint, and the
exception itself (logged with ``-vv``). A per-host function returns a value; a value with an
``verdict()`` method (:class:`Reports`) decides its host's status itself (a patch report
with a conflict is ``failed``/``patch-conflict``, one that wrote is ``changed``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from fleet.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ConnectError,
    FleetError,
    UsageError,
)

T = TypeVar("T")
Status = Literal["ok", "changed", "failed", "unreachable", "refused"]
STATUSES: tuple[Status, ...] = ("ok", "changed", "failed", "unreachable", "refused")


@dataclass(frozen=True)
class Verdict:
    """What a per-host value says about its host (see :class:`Reports`)."""

    status: Status = "ok"
    code: str | None = None
    error: str | None = None
    hint: str | None = None
    exit: int | None = None


@runtime_checkable
class Reports(Protocol):
    def verdict(self) -> Verdict: ...


_EXIT_OF: dict[str, int] = {
    "ok": EXIT_OK,
    "changed": EXIT_OK,
    "failed": EXIT_FAILED,
    "unreachable": EXIT_UNREACHABLE,
    "refused": EXIT_FAILED,
}


@dataclass
class HostOutcome(Generic[T]):
    host: str
    status: Status
    value: T | None = None
    error: str | None = None
    hint: str | None = None
    code: str | None = None
    exit: int = EXIT_OK
    exc: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "changed")

    @property
    def changed(self) -> bool:
        return self.status == "changed"

    @classmethod
    def of_value(cls, host: str, value: T) -> HostOutcome[T]:
        """The outcome of a per-host function that returned ``value``."""
        if isinstance(value, Reports):
            v = value.verdict()
            exit_code = v.exit if v.exit is not None else _EXIT_OF[v.status]
            return cls(host, v.status, value, v.error, v.hint, v.code, exit_code)
        return cls(host, "ok", value)

    @classmethod
    def of_error(cls, host: str, exc: BaseException, value: T | None = None) -> HostOutcome[T]:
        """The outcome of a per-host function that raised ``exc``."""
        if isinstance(exc, ConnectError):
            status: Status = "unreachable"
        elif isinstance(exc, UsageError):
            status = "refused"
        else:
            status = "failed"
        if isinstance(exc, FleetError):
            return cls(
                host,
                status,
                value,
                _strip(exc.message, host),
                exc.hint,
                exc.code,
                exc.exit_code,
                exc,
            )
        return cls(
            host,
            "failed",
            value,
            f"{type(exc).__name__}: {exc}",
            "this is a bug in fleet: rerun with -vv and report the traceback",
            "internal-error",
            EXIT_FAILED,
            exc,
        )

    def to_json(self, body: Callable[[T], dict[str, Any]] | None = None) -> dict[str, Any]:
        """This host's ``--json`` entry: ``ok``, ``changed``, then the body of its value
        (when there is one), and for a host that did not succeed ``status``, ``code``,
        ``error`` and ``hint``. Body fields win over the generic ones except ``ok``."""
        entry: dict[str, Any] = {"ok": self.ok, "changed": self.changed}
        if not self.ok:
            entry["status"] = self.status
            entry["code"] = self.code
            entry["error"] = self.error
            if self.hint:
                entry["hint"] = self.hint
        elif self.code:
            entry["code"] = self.code
        if body is not None and self.value is not None:
            entry.update(body(self.value))
            entry["ok"] = self.ok
        return entry


def _strip(message: str, host: str) -> str:
    prefix = f"{host}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


def hosts_json(
    outcomes: Sequence[HostOutcome[Any]], body: Callable[[Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """``{"hosts": {name: entry}}`` with every entry built by :meth:`HostOutcome.to_json`."""
    return {"hosts": {o.host: o.to_json(body) for o in outcomes}}


def raise_if_all_bad_input(outcomes: Sequence[HostOutcome[Any]]) -> None:
    """When every host was refused for bad input (exit 2: an unusable known_hosts file, a
    path outside the tree on every host), the run is a usage error: one line, exit 2."""
    if not outcomes or any(o.exit != EXIT_USAGE for o in outcomes):
        return
    first = outcomes[0]
    others = len(outcomes) - 1
    if isinstance(first.exc, UsageError) and others == 0:
        raise first.exc
    more = f" (and {others} more host{'s' if others > 1 else ''})" if others else ""
    raise UsageError(f"{first.host}: {first.error}{more}", hint=first.hint, code=first.code)


def exit_code(outcomes: Sequence[HostOutcome[Any]], *, problem_found: bool = False) -> int:
    """One exit code for a per-host run: 2 if any host's input was bad, else 3 if any host
    was unreachable, else 1 if any failed or was refused (or ``problem_found``: a diagnosis
    found a problem), else 0."""
    codes = {o.exit for o in outcomes}
    for code in (EXIT_USAGE, EXIT_UNREACHABLE, EXIT_FAILED):
        if code in codes:
            return code
    return EXIT_FAILED if problem_found else EXIT_OK

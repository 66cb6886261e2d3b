"""A run-scoped session: one SSH connection per host, shared by every step of the run."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from fleet.errors import ConnectError
from fleet.transport.connection import ConnectOptions, HostConnection, open_connection

if TYPE_CHECKING:
    from fleet.inventory import HostSpec, Inventory

MAX_JUMPS = 8
JUMP_PREFIX = "jump:"


class Session:
    """Opens at most one connection per host and closes them all at the end.

    ``connect`` is thread-safe: concurrent callers for the same host wait for the one
    connection being opened. ``opened`` counts connections actually opened per host.
    """

    def __init__(
        self, inventory: Inventory | None = None, options: ConnectOptions | None = None
    ) -> None:
        self.inventory = inventory
        self.options = options or ConnectOptions()
        self._conns: dict[str, HostConnection] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        self._failed: dict[str, ConnectError] = {}
        self.opened: dict[str, int] = {}
        self.connect_ms: dict[str, float] = {}
        self.closed = False

    def connect(self, host: HostSpec, *, _depth: int = 0) -> HostConnection:
        """The run's connection to ``host``, opened on first use.

        A host with a ``jump`` is reached through the session's connection to that
        bastion (opened once, shared by every host behind it; a bastion may have its own
        ``jump``)."""
        key = self._key(host)
        with self._guard:
            if self.closed:
                raise RuntimeError("session is closed")
            # re-entrant: a jump loop recurses in this thread until MAX_JUMPS, never deadlocks
            lock = self._locks.setdefault(key, threading.RLock())
        with lock:
            conn = self._conns.get(key)
            if conn is not None:
                return conn
            failed = self._failed.get(key)
            if failed is not None and _depth > 0:
                # a bastion that failed once in this run is not tried again per host
                raise failed
            gateway = self.gateway_for(host, _depth=_depth)
            started = time.monotonic()
            try:
                conn = open_connection(host, self.options, gateway)
            except ConnectError as exc:
                self._failed[key] = exc
                raise
            with self._guard:
                self.connect_ms[host.name] = (time.monotonic() - started) * 1000
                self.opened[host.name] = self.opened.get(host.name, 0) + 1
                if self.closed:
                    conn.close()
                    raise RuntimeError("session is closed")
                self._conns[key] = conn
            return conn

    def reconnect(self, host: HostSpec) -> HostConnection:
        """A new connection to ``host`` in place of one that was lost (a long follow)."""
        key = self._key(host)
        with self._guard:
            old = self._conns.pop(key, None)
            self._failed.pop(key, None)
        if old is not None:
            old.close()
        return self.connect(host)

    def gateway_for(self, host: HostSpec, *, _depth: int = 0) -> HostConnection | None:
        """The open bastion connection for ``host`` (None without a ``jump``)."""
        jump = self.jump_spec(host)
        if jump is None:
            return None
        if _depth >= MAX_JUMPS:
            from fleet.errors import UsageError

            raise UsageError(f"{host.name}: jump chain longer than {MAX_JUMPS} hops (a loop?)")
        try:
            gateway = self.connect(jump, _depth=_depth + 1)
        except ConnectError as exc:
            raise ConnectError(
                host.name,
                f"bastion {host.jump}: {exc.message.removeprefix(jump.name + ': ')}",
                hint=exc.hint,
                code="bastion-failed",
            ) from exc
        if not gateway.transport_alive():
            raise ConnectError(
                host.name,
                f"connection to the bastion {host.jump} was lost",
                code="bastion-failed",
            )
        return gateway

    @staticmethod
    def _key(host: HostSpec) -> str:
        # Inventory hosts by name; an address-form bastion by where it connects.
        if host.name.startswith(JUMP_PREFIX):
            # the same bastion with other credentials or pinned keys is another connection
            return (
                f"{host.user}@{host.target}:{host.port or 22} "
                f"key={host.ssh_key} known_hosts={host.known_hosts}"
            )
        return host.name

    def jump_spec(self, host: HostSpec) -> HostSpec | None:
        """The bastion for ``host``: an inventory host name or ``[user@]host[:port]``.

        A bastion given as an address inherits the host's key and known_hosts."""
        if not host.jump:
            return None
        if self.inventory is not None and host.jump in self.inventory.hosts:
            return self.inventory.hosts[host.jump]
        from fleet.errors import UsageError
        from fleet.inventory import JUMP_RE, HostSpec

        match = JUMP_RE.match(host.jump)
        if not match:
            raise UsageError(f"{host.name}: jump '{host.jump}' is not [user@]host[:port]")
        return HostSpec(
            name=f"{JUMP_PREFIX}{host.jump}",
            address=match["host"].strip("[]"),
            port=int(match["port"]) if match["port"] else None,
            user=match["user"] or host.user,
            ssh_key=host.ssh_key,
            known_hosts=host.known_hosts,
        )

    def close(self) -> None:
        with self._guard:
            self.closed = True
            conns = list(self._conns.values())
            self._conns.clear()
        for conn in conns:
            conn.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""One SSH connection to one host, and the commands run over it.

``HostConnection`` wraps a Fabric ``Connection`` (which brings ``~/.ssh/config`` handling,
ProxyJump gateways and paramiko's client) with fleet's rules:

- host keys only from the pinned known_hosts; unknown or changed keys are refused;
- a connect timeout and SSH keepalives;
- tenacity retries with backoff for transient faults while connecting (refused, reset,
  timeout, no banner), never for authentication or host-key failures;
- commands are :class:`~fleet.transport.shell.Command` texts or argv lists (quoted by
  :mod:`fleet.transport.shell`, the only module that quotes shell text);
- no remote process outlives the command that started it: stdin is held open while a
  command runs and the host ends the command's process group at EOF, i.e. when fleet
  closes the channel (timeout, Ctrl-C, an error) or the connection drops
  (:func:`~fleet.transport.shell.guarded`, and the on-host runtime's watchdog).

Commands are executed on a paramiko channel directly (rather than through Invoke's runner)
so that stdin can be sent and closed, both streams are read fully, and output can be
streamed line by line for ``--follow``.
"""

from __future__ import annotations

import getpass
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import paramiko

from fleet.errors import ConnectError, HostKeyError, OperationFailed
from fleet.transport import shell
from fleet.transport.hostkeys import UnknownHostKey, fingerprint, strict_client
from fleet.transport.runner import Dialogue, Result, command_text, log_command, split_lines
from fleet.transport.wake import steps

if TYPE_CHECKING:
    from fabric import Connection

    from fleet.inventory import HostSpec

DEFAULT_CONNECT_TIMEOUT = 10.0
KEEPALIVE_SECONDS = 15


class ConnectionLost(ConnectError):
    """The SSH connection dropped while a command was running."""

    code = "connection-lost"


log = logging.getLogger(__name__)
# paramiko's transport thread logs each failed handshake (a port that does not speak SSH,
# a reset) as ERROR records with a traceback, which Python's last-resort handler would
# print on stderr: fleet reports such a failure as one line per host, and -vv shows
# paramiko's records (fleet.cli.context.setup_logging).
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, UnknownHostKey | paramiko.BadHostKeyException):
        return False
    if isinstance(exc, paramiko.AuthenticationException):
        return False
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return True
    if isinstance(exc, socket.gaierror):
        return False
    if isinstance(exc, TimeoutError | ConnectionError | EOFError | socket.timeout):
        return True
    if isinstance(exc, paramiko.SSHException):
        text = str(exc)
        return "banner" in text or "reset" in text.lower() or "closed" in text.lower()
    return isinstance(exc, OSError)


def _handshake_stalled(exc: BaseException) -> bool:
    """paramiko's word for a peer that accepted TCP but never finished the SSH handshake
    within the timeout (a stalled, e.g. paused, host): a timeout, not a protocol error."""
    return isinstance(exc, paramiko.SSHException) and "no existing session" in str(exc).lower()


def _attempts() -> int:
    try:
        return max(1, int(os.environ.get("FLEET_CONNECT_ATTEMPTS", "3")))
    except ValueError:
        return 3


class HostConnection:
    """An open SSH connection to one inventory host."""

    def __init__(
        self,
        host: HostSpec,
        fabric_conn: Connection | DirectConnection,
        owned_gateways: list[Connection] | None = None,
    ) -> None:
        self.host = host
        self.fabric = fabric_conn
        self._owned_gateways = owned_gateways or []
        self._lock = threading.Lock()
        self.commands_run = 0

    @property
    def transport(self) -> paramiko.Transport:
        transport = self.fabric.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionLost(self.host.name, "connection lost")
        return transport

    # -- running commands ---------------------------------------------------------------

    def _open_channel(self, command: str, timeout: float | None) -> paramiko.Channel:
        chan: paramiko.Channel | None = None
        try:
            chan = self.transport.open_session(timeout=timeout or DEFAULT_CONNECT_TIMEOUT)
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if chan is not None:
                _close(chan)
            reason = str(exc) or type(exc).__name__
            raise ConnectionLost(self.host.name, f"connection lost: {reason}") from None
        self.commands_run += 1
        return chan

    def run(
        self,
        command: shell.Command | Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
    ) -> Result:
        """Run a command, send ``stdin`` (then EOF), and collect both streams.

        ``timeout`` bounds the whole command; on expiry the channel is closed and
        :class:`OperationFailed` is raised. A dropped connection raises
        :class:`ConnectionLost` (exit 3, naming the host).

        Without ``stdin`` the command runs under :func:`fleet.transport.shell.guarded`
        and a :class:`~fleet.transport.shell.Held` command gets its payload: in both
        cases stdin stays open until the command ends, so that when fleet gives up (the
        timeout, Ctrl-C, an error) the host sees EOF and ends what fleet started.
        """
        cmd = command_text(command)
        held = isinstance(cmd, shell.Held) or stdin is None
        sent = cmd if stdin is not None or isinstance(cmd, shell.Held) else shell.guarded(cmd)
        started = time.monotonic()
        deadline = started + timeout if timeout else None
        chan = self._open_channel(sent, timeout)
        err_chunks: list[bytes] = []
        out_chunks: list[bytes] = []
        failure: list[BaseException] = []

        def pump_stderr() -> None:
            try:
                while True:
                    data = chan.recv_stderr(65536)
                    if not data:
                        return
                    err_chunks.append(data)
            except Exception as exc:  # surfaced by the main thread
                failure.append(exc)

        reader = threading.Thread(target=pump_stderr, daemon=True)
        reader.start()
        try:
            if stdin is not None:
                data = stdin.encode() if isinstance(stdin, str) else stdin
                try:
                    chan.sendall(data)
                except OSError:
                    # The command ended before reading all of its input (e.g. exec of a
                    # missing interpreter): its exit status says what happened.
                    if not chan.exit_status_ready():
                        raise
            if not chan.closed and not held:
                chan.shutdown_write()
            while True:
                data = _recv(chan, deadline)
                if not data:
                    break
                out_chunks.append(data)
            if deadline is not None:
                remaining = max(0.01, deadline - time.monotonic())
                if not chan.status_event.wait(remaining):
                    raise TimeoutError()
            exit_code = chan.recv_exit_status()
            reader.join(timeout=5)
            if failure:
                raise failure[0]
        except TimeoutError:
            _close(chan)
            raise OperationFailed(
                f"{self.host.name}: command timed out after {timeout:.0f}s: "
                f"{_short(shell.masked(cmd))}",
                code="command-timeout",
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(
                self.host.name,
                f"connection lost while running {_short(shell.masked(cmd))}: {exc}",
            ) from None
        finally:
            _close(chan)
        if exit_code == -1:
            # The channel closed without an exit status: the connection dropped.
            raise ConnectionLost(
                self.host.name, f"connection lost while running {_short(shell.masked(cmd))}"
            )
        out = b"".join(out_chunks)
        err = b"".join(err_chunks)
        res = Result(
            host=self.host.name,
            command=cmd,
            exit_code=exit_code,
            stdout_bytes=out,
            stderr_bytes=err,
            duration_s=time.monotonic() - started,
            bytes_received=len(out) + len(err),
        )
        log_command(self.host.name, cmd, res)
        return res

    def stream(
        self, command: shell.Command | Sequence[str], *, timeout: float | None = None
    ) -> Iterator[str]:
        """Yield stdout lines as they arrive (for ``--follow``); see :meth:`stream_bytes`."""
        return split_lines(self.stream_bytes(command, timeout=timeout))

    def stream_bytes(
        self,
        command: shell.Command | Sequence[str],
        *,
        timeout: float | None = None,
        tick: bool = False,
    ) -> Generator[bytes, None, None]:
        """Yield stdout as it arrives, in chunks; stderr is discarded.

        ``timeout`` is the longest wait for new output: then the generator ends, or with
        ``tick`` yields ``b""`` and goes on waiting (a caller that watches the clock while
        a remote command is silent). The command's stdin stays open while the stream is
        read: closing the generator closes the channel, and a remote command that waits
        for the end of its stdin (``cat <&3 >/dev/null; kill ...``, see fleet.transport.follow)
        ends with it even when it never writes again. A dropped connection raises
        :class:`ConnectionLost`.
        """
        cmd = command_text(command)
        log.debug("%s: streaming: %s", self.host.name, shell.masked(cmd)[:500])
        chan = self._open_channel(shell.guarded(cmd, stdin_open=True), timeout)
        try:
            while True:
                try:
                    data = _recv(chan, None if timeout is None else time.monotonic() + timeout)
                except TimeoutError:
                    if tick:
                        yield b""
                        continue
                    return
                if not data:  # end of the stream: the command ended, or the connection
                    break
                yield data
            if chan.recv_exit_status() == -1:
                raise ConnectionLost(self.host.name, "connection lost while streaming")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(
                self.host.name, f"connection lost while streaming: {exc}"
            ) from None
        finally:
            _close(chan)

    def dialogue(self, command: shell.Held) -> Dialogue:
        """``command`` with its stdin held for more input (see
        :class:`~fleet.transport.runner.Dialogue`); a dropped connection raises
        :class:`ConnectionLost`."""
        if not isinstance(command, shell.Held):
            raise TypeError("a dialogue runs a Held command (it reads its own stdin)")
        log.debug("%s: dialogue: %s", self.host.name, shell.masked(command)[:500])
        return _ChannelDialogue(self.host.name, command, self._open_channel(command, None))

    def open_tcp(self, port: int, *, host: str = "127.0.0.1", timeout: float = 10.0) -> Any:
        """A direct-tcpip channel to ``host:port`` as the host sees it (nothing needs to
        be reachable from the control machine). Refused (nothing listens, as during a
        vLLM load): :class:`ConnectionRefusedError`."""
        try:
            return self.transport.open_channel(
                "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as exc:
            raise ConnectionRefusedError(f"{host}:{port} on {self.host.name}: {exc}") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(self.host.name, f"connection lost: {exc}") from None

    def transport_alive(self) -> bool:
        transport = self.fabric.client.get_transport()
        return bool(transport and transport.is_active())

    def close(self) -> None:
        """Close the connection and any bastion hops opened for it alone."""
        for conn in [self.fabric, *self._owned_gateways]:
            try:
                conn.close()
            except Exception:
                pass


class _ChannelDialogue(Dialogue):
    """A :class:`~fleet.transport.runner.Dialogue` over one SSH channel."""

    def __init__(self, host: str, command: shell.Command, chan: paramiko.Channel) -> None:
        super().__init__(host, command)
        self.chan = chan

        def pump() -> None:
            try:
                while block := chan.recv_stderr(65536):
                    self._err.append(block)
            except Exception:  # the channel closed: stdout's end says what happened
                pass

        threading.Thread(target=pump, daemon=True).start()

    def _lost(self, exc: BaseException | None = None) -> ConnectionLost:
        why = f": {exc}" if exc is not None and str(exc) else ""
        return ConnectionLost(
            self.host, f"connection lost while running {_short(shell.masked(self.command))}{why}"
        )

    def send(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except OSError as exc:
            if not self.chan.exit_status_ready():  # else: it ended first, its status tells
                raise self._lost(exc) from None
        except (paramiko.SSHException, EOFError) as exc:
            raise self._lost(exc) from None

    def _read(self, deadline: float | None) -> bytes:
        try:
            return _recv(self.chan, deadline)
        except TimeoutError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(exc) from None

    def _exit_status(self, deadline: float | None) -> int:
        for step in steps(deadline):
            if self.chan.status_event.wait(step):
                break
        code = self.chan.recv_exit_status()
        if code == -1:  # closed without an exit status: the connection dropped
            raise self._lost()
        return code

    def close(self) -> None:
        _close(self.chan)


def _recv(chan: paramiko.Channel, deadline: float | None) -> bytes:
    """The channel's next stdout bytes (b"" at its end), waiting until ``deadline``
    (monotonic; None: no end), then :class:`TimeoutError`; see :mod:`fleet.transport.wake`
    for why the main thread waits in steps."""
    for step in steps(deadline):
        chan.settimeout(step)
        try:
            return chan.recv(65536)
        except TimeoutError:
            continue  # a step ended: the main thread runs byte code (and a pending Ctrl-C)
    raise AssertionError("unreachable: steps() ends by raising TimeoutError")


def _close(chan: paramiko.Channel) -> None:
    """Close a channel; over a connection that already dropped there is nothing to tell
    (the host sees the connection end, which ends the command: shell.guarded)."""
    try:
        chan.close()
    except (EOFError, OSError, paramiko.SSHException):
        pass


def _short(cmd: str, limit: int = 80) -> str:
    return cmd if len(cmd) <= limit else cmd[: limit - 3] + "..."


# -- opening connections ----------------------------------------------------------------


@dataclass
class ConnectOptions:
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    attempts: int = field(default_factory=_attempts)
    ssh_config_path: str | None = field(default_factory=lambda: os.environ.get("FLEET_SSH_CONFIG"))


# The ssh_config settings only Fabric applies. A host whose entry sets none of them (and
# that has no bastion) is reached by paramiko alone (DirectConnection): Fabric and Invoke
# are not imported and no Fabric Config is built per host.
SSH_CONFIG_FABRIC = frozenset({"identityfile", "proxyjump", "proxycommand", "forwardagent"})
SYSTEM_SSH_CONFIG = "/etc/ssh/ssh_config"
USER_SSH_CONFIG = "~/.ssh/config"


class DirectConnection:
    """The part of a Fabric ``Connection`` fleet uses (``client``, ``gateway``, ``open``,
    ``close``), on paramiko alone, for a host that ssh_config does not send through a
    proxy or give keys: the same ``SSHClient.connect`` call Fabric would make."""

    gateway = None

    def __init__(
        self, host: str, port: int, user: str, timeout: float, kwargs: dict[str, Any]
    ) -> None:
        self.host, self.port, self.user = host, port, user
        self.connect_timeout = timeout
        self.connect_kwargs = kwargs
        self.client = paramiko.SSHClient()

    @property
    def transport(self) -> paramiko.Transport | None:
        return self.client.get_transport()

    @property
    def is_connected(self) -> bool:
        transport = self.client.get_transport()
        return bool(transport and transport.is_active())

    def open(self) -> None:
        """Connect (once: a bastion's connection is opened again by Fabric for each host
        behind it, which must find it open, as with Fabric's own)."""
        if self.is_connected:
            return
        self.client.connect(
            hostname=self.host,
            port=self.port,
            username=self.user,
            timeout=self.connect_timeout,
            **self.connect_kwargs,
        )

    def close(self) -> None:
        self.client.close()


_SSH_CONFIGS: dict[tuple[Any, ...], paramiko.SSHConfig | None] = {}
_SSH_CONFIG_LOCK = threading.Lock()


def _ssh_config(options: ConnectOptions) -> paramiko.SSHConfig | None:
    """The ssh_config Fabric would load (the runtime file, else the user's and the
    system's), parsed once per process while the files are unchanged; None when it
    cannot be read here (Fabric then reads it, and says what is wrong)."""
    if options.ssh_config_path is not None:
        paths = [options.ssh_config_path or os.devnull]
        if not os.path.exists(paths[0]):
            return None
    else:
        paths = [os.path.expanduser(USER_SSH_CONFIG), SYSTEM_SSH_CONFIG]
    stamps: list[Any] = []
    for path in paths:
        try:
            st = os.stat(path)
            stamps.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            stamps.append((path, None))
    key = tuple(stamps)
    with _SSH_CONFIG_LOCK:
        if key in _SSH_CONFIGS:
            return _SSH_CONFIGS[key]
        config: paramiko.SSHConfig | None = paramiko.SSHConfig()
        try:
            for path in paths:
                if os.path.isfile(path):
                    with open(path) as fh:
                        config.parse(fh)  # type: ignore[union-attr]
        except Exception:
            config = None
        _SSH_CONFIGS[key] = config
        return config


def _direct(
    spec: HostSpec, options: ConnectOptions, kwargs: dict[str, Any], timeout: int
) -> DirectConnection | None:
    config = _ssh_config(options)
    if config is None:
        return None
    try:
        entry = config.lookup(spec.target)
    except Exception:  # Fabric meets the same problem and reports it
        return None
    if any(k in SSH_CONFIG_FABRIC or k.startswith("canonical") for k in entry):
        return None
    host = str(entry.get("hostname", spec.target))
    user = spec.user or str(entry.get("user") or getpass.getuser())
    try:
        port = int(spec.port or entry.get("port") or 22)
    except ValueError:
        return None
    return DirectConnection(host, port, user, timeout, kwargs)


_KEYS: dict[tuple[Any, ...], paramiko.PKey | None] = {}
_KEYS_LOCK = threading.Lock()


def _private_key(path: str) -> paramiko.PKey | None:
    """The unencrypted key at ``path``, read once per process while the file is unchanged
    (paramiko would read and parse it for every host). None (paramiko reads the file
    itself, as before) for a key with a passphrase or a certificate beside it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if os.path.exists(path + "-cert.pub"):
        return None
    key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
    with _KEYS_LOCK:
        if key not in _KEYS:
            try:
                _KEYS[key] = paramiko.PKey.from_path(path)
            except Exception:
                _KEYS[key] = None
        return _KEYS[key]


def configured_connection(
    spec: HostSpec,
    options: ConnectOptions,
    gateway: Connection | DirectConnection | None = None,
) -> Connection | DirectConnection:
    """A configured (not yet opened) connection with strict host-key checking: a
    :class:`DirectConnection` when ssh_config leaves the host alone and there is no
    bastion, else a Fabric Connection (ssh_config's keys, ProxyJump, ProxyCommand)."""
    connect_kwargs: dict[str, Any] = {
        "banner_timeout": options.connect_timeout,
        "auth_timeout": options.connect_timeout,
    }
    if spec.ssh_key:
        connect_kwargs["key_filename"] = [str(Path(spec.ssh_key).expanduser())]
        connect_kwargs["look_for_keys"] = False
        connect_kwargs["allow_agent"] = False
    # Fabric wants whole seconds; never round a short timeout down to 0 (= none).
    timeout = max(1, math.ceil(spec.connect_timeout or options.connect_timeout))
    if gateway is None:
        direct = _direct(spec, options, dict(connect_kwargs), timeout)
        if direct is not None:
            if spec.ssh_key:
                pkey = _private_key(connect_kwargs["key_filename"][0])
                if pkey is not None:
                    direct.connect_kwargs.pop("key_filename")
                    direct.connect_kwargs["pkey"] = pkey
            _strict(direct, spec.known_hosts_path(), spec.name)
            return direct
    from fabric import Config, Connection

    config_kwargs: dict[str, Any] = {}
    if options.ssh_config_path is not None:
        config_kwargs["runtime_ssh_path"] = options.ssh_config_path or os.devnull
        config_kwargs["overrides"] = {"load_ssh_configs": True}
    config = Config(**config_kwargs)
    kwargs: dict[str, Any] = {
        "host": spec.target,
        "config": config,
        "connect_timeout": timeout,
        "connect_kwargs": connect_kwargs,
    }
    if spec.user:
        kwargs["user"] = spec.user
    if spec.port:
        kwargs["port"] = spec.port
    if gateway is not None:
        kwargs["gateway"] = gateway
    conn = Connection(**kwargs)
    known = spec.known_hosts_path()
    _strict(conn, known, spec.name)
    # A ProxyJump from ~/.ssh/config makes Fabric build the bastion Connection(s) itself,
    # with paramiko's AutoAddPolicy: hold every hop to the same pinned keys.
    hop = conn.gateway
    while isinstance(hop, Connection) and hop is not gateway:
        _strict(hop, known, spec.name)
        hop = hop.gateway
    return conn


def _strict(conn: Connection | DirectConnection, known_hosts: Path, label: str) -> None:
    # fleet's own known_hosts reader (OpenSSH semantics, bounded, linear), not paramiko's
    strict_client(conn.client, known_hosts, label)


def _owned_gateways(
    conn: Connection | DirectConnection, shared: Connection | DirectConnection | None
) -> list[Connection]:
    """Gateway connections created for ``conn`` alone (from ~/.ssh/config ProxyJump)."""
    if isinstance(conn, DirectConnection):
        return []
    from fabric import Connection as FabricConnection

    hops: list[Connection] = []
    hop = conn.gateway
    while isinstance(hop, FabricConnection) and hop is not shared:
        hops.append(hop)
        hop = hop.gateway
    return hops


T = TypeVar("T")
RETRY_FIRST_WAIT = 0.5  # seconds before the second attempt; doubling, at most RETRY_MAX_WAIT
RETRY_MAX_WAIT = 4.0


def _with_retries(attempt: Callable[[], T], attempts: int) -> T:
    """``attempt()``, retried with tenacity (exponential backoff: 0.5 s, 1 s, 2 s, 4 s...)
    while it fails with a transient fault, ``attempts`` tries in all. The first try runs
    before tenacity is imported: a run whose connections all open pays nothing for it."""
    try:
        return attempt()
    except BaseException as exc:
        if attempts <= 1 or not _is_transient(exc):
            raise
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    time.sleep(RETRY_FIRST_WAIT)
    retrying = Retrying(
        stop=stop_after_attempt(attempts - 1),
        wait=wait_exponential(multiplier=2 * RETRY_FIRST_WAIT, max=RETRY_MAX_WAIT),
        retry=retry_if_exception(_is_transient),
        reraise=True,
    )
    return retrying(attempt)


def open_connection(
    spec: HostSpec, options: ConnectOptions, gateway: HostConnection | None = None
) -> HostConnection:
    """Open one connection (with retries for transient faults) or raise ConnectError.

    ``gateway`` is an open connection to the bastion (shared by every host behind it)."""
    shared = gateway.fabric if gateway is not None else None

    def attempt() -> Connection | DirectConnection:
        conn = configured_connection(spec, options, shared)
        try:
            conn.open()
        except BaseException as exc:
            conn.close()
            for hop in _owned_gateways(conn, shared):
                hop.close()
            if _handshake_stalled(exc):
                raise TimeoutError() from None
            raise
        transport = conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_SECONDS)
        return conn

    where = f"{spec.user + '@' if spec.user else ''}{spec.target}:{spec.port or 22}"
    try:
        conn = _with_retries(attempt, options.attempts)
    except UnknownHostKey as exc:
        raise HostKeyError(
            spec.name,
            f"host key of {exc.hostname} is not pinned in {spec.known_hosts_path()} "
            f"({exc.key.get_name()} {fingerprint(exc.key)}); refusing to connect",
            hint=f"check the fingerprint, then run: fleet trust --host {spec.name} --accept-new",
            code="host-key-unknown",
        ) from None
    except paramiko.BadHostKeyException as exc:
        raise HostKeyError(
            spec.name,
            f"HOST KEY CHANGED for {exc.hostname}: pinned {fingerprint(exc.expected_key)}, "
            f"offered {fingerprint(exc.key)}; refusing to connect (possible impersonation)",
            hint=f"if the host was reinstalled, remove its line from {spec.known_hosts_path()} "
            f"and run: fleet trust --host {spec.name} --accept-new",
            code="host-key-changed",
        ) from None
    except paramiko.AuthenticationException as exc:
        raise ConnectError(
            spec.name,
            f"authentication failed for {where}: {exc}",
            hint="check the host's user and ssh_key in the inventory",
            code="auth-failed",
        ) from None
    except paramiko.ssh_exception.NoValidConnectionsError:
        raise ConnectError(
            spec.name,
            f"cannot connect to {where}: connection refused ({options.attempts} attempts)",
            code="connect-refused",
        ) from None
    except socket.gaierror as exc:
        raise ConnectError(
            spec.name, f"cannot resolve {spec.target}: {exc.strerror}", code="dns-failed"
        ) from None
    except TimeoutError:
        raise ConnectError(
            spec.name,
            f"cannot connect to {where}: timed out after "
            f"{options.connect_timeout:.0f}s ({options.attempts} attempts)",
            code="connect-timeout",
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        reason = _one_line(str(exc) or type(exc).__name__)
        if "banner" in reason.lower():
            raise ConnectError(
                spec.name, f"cannot connect to {where}: no SSH server answered there ({reason})"
            ) from None
        raise ConnectError(spec.name, f"cannot connect to {where}: {reason}") from None
    return HostConnection(spec, conn, owned_gateways=_owned_gateways(conn, shared))


def _one_line(text: str) -> str:
    """paramiko's message on one line (``...banner[Errno 104] ...`` gets its space)."""
    return " ".join(text.replace("banner[", "banner: [").split())


def scan_host_key(
    spec: HostSpec, options: ConnectOptions, gateway: HostConnection | None = None
) -> tuple[str, paramiko.PKey]:
    """The key the server offers, fetched without authenticating (like ``ssh-keyscan``).

    Returns the known_hosts name and the key. When a key is already pinned for the host,
    that key type is asked for, so that a changed key is not mistaken for a new type.
    Through a bastion (an open, already trusted ``gateway`` connection) the key is fetched
    over a direct-tcpip channel.
    """
    from fleet.transport.hostkeys import known_hosts_name, load_known_hosts

    port = spec.port or 22
    name = known_hosts_name(spec.target, port)
    sock: Any
    try:
        if gateway is not None:
            sock = gateway.transport.open_channel(
                "direct-tcpip",
                (spec.target, port),
                ("127.0.0.1", 0),
                timeout=options.connect_timeout,
            )
        else:
            sock = socket.create_connection((spec.target, port), timeout=options.connect_timeout)
    except ConnectError:
        raise
    except (OSError, paramiko.SSHException) as exc:
        raise ConnectError(spec.name, f"cannot connect to {spec.target}:{port}: {exc}") from None
    transport = paramiko.Transport(sock)
    try:
        pinned = load_known_hosts(spec.known_hosts_path()).lookup(name)
        if pinned:
            opts = transport.get_security_options()
            wanted = [t for t in opts.key_types if t in set(pinned.keys())]
            if wanted:
                opts.key_types = wanted
        transport.banner_timeout = options.connect_timeout
        transport.start_client(timeout=options.connect_timeout)
        return name, transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise ConnectError(
            spec.name, f"no SSH server answered at {spec.target}:{port}: {exc}"
        ) from None
    finally:
        transport.close()

"""What runs a command on a host: the :class:`Runner` protocol, :class:`Result`, and
:class:`LocalRunner` (this machine as a host).

``HostConnection`` (SSH) and ``LocalRunner`` both satisfy :class:`Runner`: every remote
effect in fleet (facts, source, patch, logs, serve) is written against the protocol, so it
runs unchanged on this machine — which is what the unit tests of those effects do, with
real processes instead of stand-ins.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fleet.errors import OperationFailed
from fleet.transport import shell
from fleet.transport.wake import steps

if TYPE_CHECKING:
    from fleet.inventory import HostSpec

log = logging.getLogger(__name__)


@dataclass
class Result:
    """What a remote command did (Fabric's ``Result`` vocabulary)."""

    host: str
    command: str
    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    duration_s: float
    bytes_received: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    def check(self, what: str = "command") -> Result:
        """Raise :class:`OperationFailed` naming the host when the command failed."""
        if not self.ok:
            lines = self.stderr.strip().splitlines() or self.stdout.strip().splitlines()
            tail = lines[-1] if lines else ""
            raise OperationFailed(f"{self.host}: {what} exited {self.exit_code}: {tail}")
        return self


class Dialogue:
    """A command that goes on reading its stdin while it answers: :meth:`send` input,
    :meth:`read_through` its stdout up to a marker, send again. One process and one
    channel serve several requests (``fleet patch`` reads, plans on this machine, then
    writes). Closing it closes the command's stdin: the host then ends what it started, as
    for every command (:mod:`fleet.transport.shell`). Subclasses move the bytes."""

    def __init__(self, host: str, command: shell.Command) -> None:
        self.host = host
        self.command = command
        self.ended = False  # stdout reached its end (then ``exit_code`` is known)
        self.exit_code: int | None = None
        self.started = time.monotonic()
        self._buffer = bytearray()
        self._err: list[bytes] = []

    @property
    def stderr_bytes(self) -> bytes:
        return b"".join(self._err)

    def read_through(self, marker: bytes, *, timeout: float | None) -> bytes:
        """Stdout from where the last read stopped through the end of the first line that
        holds ``marker``; at the end of stdout before any marker, what is left (and
        ``ended``). Past ``timeout`` the dialogue is closed and :class:`OperationFailed`
        (``command-timeout``) raised."""
        deadline = None if timeout is None else time.monotonic() + timeout
        searched = 0
        while True:
            at = self._buffer.find(marker, searched)
            if at >= 0:
                eol = self._buffer.find(b"\n", at + len(marker))
                if eol >= 0 or self.ended:
                    cut = len(self._buffer) if eol < 0 else eol + 1
                    out = bytes(self._buffer[:cut])
                    del self._buffer[:cut]
                    return out
            else:
                searched = max(0, len(self._buffer) - len(marker) + 1)
            if self.ended:
                out = bytes(self._buffer)
                self._buffer.clear()
                return out
            try:
                chunk = self._read(deadline)
                if not chunk:
                    self.exit_code = self._exit_status(deadline)
                    self.ended = True
            except TimeoutError:
                self.close()
                raise OperationFailed(
                    f"{self.host}: command timed out after {timeout:.0f}s: "
                    f"{shell.masked(self.command)[:80]}",
                    code="command-timeout",
                ) from None
            self._buffer += chunk

    def result(self, stdout: bytes) -> Result:
        """``stdout`` of one turn as a :class:`Result` (exit 0 while the command runs)."""
        return Result(
            host=self.host,
            command=self.command,
            exit_code=self.exit_code if self.exit_code is not None else 0,
            stdout_bytes=stdout,
            stderr_bytes=self.stderr_bytes,
            duration_s=time.monotonic() - self.started,
            bytes_received=len(stdout),
        )

    def __enter__(self) -> Dialogue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # what a subclass provides
    def send(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin (all of it)."""
        raise NotImplementedError

    def _read(self, deadline: float | None) -> bytes:
        """The next stdout bytes, b"" at its end; :class:`TimeoutError` at ``deadline``."""
        raise NotImplementedError

    def _exit_status(self, deadline: float | None) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Runner(Protocol):
    """A host fleet can run commands on."""

    @property
    def host(self) -> HostSpec: ...

    def run(
        self,
        command: shell.Command | Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
    ) -> Result: ...

    def stream(
        self, command: shell.Command | Sequence[str], *, timeout: float | None = None
    ) -> Iterator[str]: ...

    def stream_bytes(
        self,
        command: shell.Command | Sequence[str],
        *,
        timeout: float | None = None,
        tick: bool = False,
    ) -> Generator[bytes, None, None]: ...

    def open_tcp(self, port: int, *, host: str = "127.0.0.1", timeout: float = 10.0) -> Any: ...

    def dialogue(self, command: shell.Held) -> Dialogue: ...


def command_text(command: shell.Command | Sequence[str]) -> shell.Command:
    """The shell text of a command: a :class:`~fleet.transport.shell.Command` as it is,
    an argv list joined by :func:`fleet.transport.shell.join`."""
    if isinstance(command, shell.Command):
        return command
    if isinstance(command, str):
        raise TypeError("commands are built by fleet.transport.shell (got a plain string)")
    return shell.join(list(command))


def log_command(host: str, command: str, res: Result) -> None:
    """One debug line per remote command (``-vv``): host, exit code, duration, bytes."""
    log.debug(
        "%s: exit %d in %.3fs, %d bytes: %s",
        host,
        res.exit_code,
        res.duration_s,
        res.bytes_received,
        shell.masked(command)[:500],
    )


class LocalRunner:
    """This machine as a host: commands run as sshd would run them, ``<login shell> -c
    COMMAND`` (default ``/bin/sh``), in ``cwd`` (default: the current directory) with
    ``env`` (default: this process's environment)."""

    def __init__(
        self,
        host: HostSpec | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        login_shell: str = "/bin/sh",
    ) -> None:
        if host is None:
            import sys

            from fleet.inventory import HostSpec

            host = HostSpec(name="local", python=sys.executable)
        self._host = host
        self.cwd = os.fspath(cwd) if cwd is not None else None
        self.env = env
        self.login_shell = login_shell
        self.commands_run = 0
        self.commands: list[str] = []

    @property
    def host(self) -> HostSpec:
        return self._host

    def run(
        self,
        command: shell.Command | Sequence[str],
        *,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
    ) -> Result:
        """As over SSH: without ``stdin`` the command runs under
        :func:`~fleet.transport.shell.guarded`, and its stdin (or a
        :class:`~fleet.transport.shell.Held` command's, after the payload) stays open until
        it ends; on the timeout stdin is closed and the command's process group ended."""
        cmd = command_text(command)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        held = isinstance(cmd, shell.Held) or data is None
        sent = cmd if data is not None or isinstance(cmd, shell.Held) else shell.guarded(cmd)
        started = time.monotonic()
        proc = self._start(cmd, sent, stderr=subprocess.PIPE)
        out, err, timed_out = _exchange(proc, data or b"", hold=held, timeout=timeout)
        if timed_out:
            raise OperationFailed(
                f"{self.host.name}: command timed out after {timeout:.0f}s",
                code="command-timeout",
            )
        code = proc.returncode
        res = Result(
            host=self.host.name,
            command=cmd,
            exit_code=code if code >= 0 else 128 - code,
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
        """Yield stdout lines as they arrive; closing the generator ends the command."""
        return split_lines(self.stream_bytes(command, timeout=timeout))

    def stream_bytes(
        self,
        command: shell.Command | Sequence[str],
        *,
        timeout: float | None = None,
        tick: bool = False,
    ) -> Generator[bytes, None, None]:
        """Yield stdout as it arrives; ``timeout`` is the longest wait for new output
        (then the stream ends, or with ``tick`` yields ``b""``). The command's stdin is held
        open while streaming, as over SSH."""
        import selectors
        import signal

        cmd = command_text(command)
        proc = self._start(cmd, shell.guarded(cmd, stdin_open=True), stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        try:
            while True:
                if not sel.select(timeout):
                    if tick:
                        yield b""
                        continue
                    return
                data = os.read(proc.stdout.fileno(), 65536)
                if not data:
                    break
                yield data
        finally:
            sel.close()
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait()
            proc.stdout.close()

    def dialogue(self, command: shell.Held) -> Dialogue:
        """``command`` with its stdin held for more input (see :class:`Dialogue`)."""
        if not isinstance(command, shell.Held):
            raise TypeError("a dialogue runs a Held command (it reads its own stdin)")
        proc = self._start(command, command, stderr=subprocess.PIPE)
        return _ProcessDialogue(self.host.name, command, proc)

    def _start(self, cmd: shell.Command, sent: str, *, stderr: int) -> subprocess.Popen[bytes]:
        """``<login shell> -c sent`` as sshd starts a command (its own session, stdin and
        stdout piped), counted as the run of ``cmd``."""
        self.commands_run += 1
        self.commands.append(cmd)
        return subprocess.Popen(
            [self.login_shell, "-c", sent],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=self.cwd,
            env=self.env,
            start_new_session=True,
        )

    def connect(self, host: HostSpec | None = None) -> LocalRunner:
        """This runner, as a session's connection to its one host (tests, local use)."""
        return self

    reconnect = connect

    def open_tcp(self, port: int, *, host: str = "127.0.0.1", timeout: float = 10.0) -> Any:
        """A TCP connection to ``host:port`` on this machine."""
        import socket

        return socket.create_connection((host, port), timeout=timeout)


MAX_LINE_BYTES = 1 << 20  # a longer streamed line is cut here (the rest up to its end dropped)


class LineSplitter:
    """Lines of a byte stream fed in chunks (``feed``), split on the bytes of ``breaks``;
    ``flush`` gives the last line, which has no line end. A line longer than ``max_line``
    bytes is cut there and the rest of it dropped, so a stream of one endless line (NUL
    bytes) costs bounded memory, and a chunk costs time linear in its size. Empty lines
    are lines unless ``keep_empty`` is false."""

    def __init__(
        self, max_line: int = MAX_LINE_BYTES, *, breaks: bytes = b"\n", keep_empty: bool = True
    ) -> None:
        self.max_line = max_line
        self.keep_empty = keep_empty
        self._split = re.compile(b"[" + re.escape(breaks) + b"]").split
        self._pending: list[bytes] = []
        self._size = 0
        self._cut = False  # the current line was cut: drop bytes up to its end

    def feed(self, data: bytes) -> list[str]:
        out: list[str] = []
        parts = self._split(data)
        for i, part in enumerate(parts):
            if not self._cut:
                room = self.max_line - self._size
                if len(part) > room:
                    self._pending.append(part[:room])
                    out.append(self._take())
                    self._cut = True
                elif part:
                    self._pending.append(part)
                    self._size += len(part)
            if i == len(parts) - 1:
                break  # the last part has no line end yet
            if not self._cut and (self._pending or self.keep_empty):
                out.append(self._take())
            self._cut = False
        return out

    def flush(self) -> str | None:
        """The last line, without its line end (None: there is none, or it was cut)."""
        return self._take() if self._pending and not self._cut else None

    @property
    def pending(self) -> int:
        """Bytes of the incomplete line held back."""
        return self._size

    def _take(self) -> str:
        line = b"".join(self._pending).decode("utf-8", errors="replace")
        self._pending, self._size = [], 0
        return line


def split_lines(chunks: Iterator[bytes], max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Decoded lines of a byte stream (a last line without a newline included); closing
    the line iterator closes the stream. Long lines are cut (:class:`LineSplitter`)."""
    splitter = LineSplitter(max_line)
    try:
        for data in chunks:
            yield from splitter.feed(data)
        last = splitter.flush()
        if last is not None:
            yield last
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


class _ProcessDialogue(Dialogue):
    """A :class:`Dialogue` with a local process (:meth:`LocalRunner.dialogue`)."""

    def __init__(self, host: str, command: shell.Command, proc: subprocess.Popen[bytes]) -> None:
        import threading

        super().__init__(host, command)
        self.proc = proc
        assert proc.stderr is not None

        def pump(fd: int) -> None:
            while block := os.read(fd, 65536):
                self._err.append(block)

        self._pump = threading.Thread(target=pump, args=(proc.stderr.fileno(),), daemon=True)
        self._pump.start()

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # it ended before reading its input: its exit status says what happened

    def _read(self, deadline: float | None) -> bytes:
        import select

        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        for step in steps(deadline):
            if select.select([fd], [], [], step)[0]:
                return os.read(fd, 65536)
        raise AssertionError("unreachable: steps() ends by raising TimeoutError")

    def _exit_status(self, deadline: float | None) -> int:
        code = None
        for step in steps(deadline):
            try:
                code = self.proc.wait(step)
                break
            except subprocess.TimeoutExpired:
                continue
        assert code is not None
        self._pump.join(5.0)
        return code if code >= 0 else 128 - code

    def close(self) -> None:
        """Close stdin and return, as closing an SSH channel does: EOF ends an idle
        script at once and a holding write when it is done (fleet/onhost/_common.py); a
        thread reaps it, and ends only one that outlives all that."""
        import threading

        proc = self.proc
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
        if proc.poll() is not None:
            self._reap()
        else:
            threading.Thread(target=self._reap, name="fleet-reap", daemon=True).start()

    def _reap(self) -> None:
        import signal

        proc = self.proc
        _end_group(proc, ((None, 10.0), (signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)))
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _end_group(proc: subprocess.Popen[bytes], steps: tuple[tuple[int | None, float], ...]) -> None:
    """Wait for ``proc`` to end, first sending its process group each step's signal (None:
    none) and then waiting that step's grace, until it has ended."""
    for sig, grace in steps:
        if sig is not None:
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue


def _exchange(
    proc: subprocess.Popen[bytes], data: bytes, *, hold: bool, timeout: float | None
) -> tuple[bytes, bytes, bool]:
    """Send ``data`` (then close stdin unless ``hold``), collect both streams, wait.

    Returns (stdout, stderr, timed out). Stdin is closed once the process ends; on the
    timeout it is closed first (a guarded command ends its process group at EOF), then the
    process group is sent SIGTERM and, after a grace period, SIGKILL."""
    import signal
    import threading

    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    chunks: dict[int, list[bytes]] = {1: [], 2: []}

    def pump(fd: int, sink: list[bytes]) -> None:
        while True:
            block = os.read(fd, 65536)
            if not block:
                return
            sink.append(block)

    def feed() -> None:
        assert proc.stdin is not None
        try:
            if data:
                proc.stdin.write(data)
                proc.stdin.flush()
            if not hold:
                proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the command ended before reading all of its input

    threads = [
        threading.Thread(target=pump, args=(proc.stdout.fileno(), chunks[1]), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr.fileno(), chunks[2]), daemon=True),
        threading.Thread(target=feed, daemon=True),
    ]
    for thread in threads:
        thread.start()
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        try:
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
        if timed_out or proc.poll() is None:
            _end_group(proc, ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)))
    for thread in threads[:2]:
        thread.join(None if not timed_out else 5.0)
    threads[2].join(1.0)
    proc.stdout.close()
    proc.stderr.close()
    return b"".join(chunks[1]), b"".join(chunks[2]), timed_out

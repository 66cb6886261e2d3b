"""Following a remote log through a 40-minute load: one long-lived stream from a byte
offset, resumed after a dropped connection with no byte lost or repeated (used by
``fleet serve`` and ``fleet logs --follow``).

The remote command (:func:`follow_command`) prints a header ``\\x1eFLEET <token> <inode>
<size>\\x1e``, then ``tail -c +<offset+1> -F`` of the log, and — when the followed process
(``pid``) has exited — an end marker ``\\x1eFLEET-END <token>\\x1e`` (record separators and a
random token: no log line can look like them). fleet keeps the command's stdin open; when
fleet goes away the remote side sees its end and stops the ``tail`` (nothing outlives the
follow). :class:`LogFollower` counts the bytes it received; when the stream breaks
(``ConnectionLost``) it asks its link (:class:`~fleet.transport.link.HostLink`: backoff
with tenacity, within the operation's deadline) for a new connection and asks for the
byte after the last one it has. A log whose inode changed, or that is shorter than the
offset, was rotated or truncated: the follow restarts at its first byte and says so.
"""

from __future__ import annotations

import hashlib
import logging
import secrets as _secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fleet.errors import ConnectError
from fleet.transport import shell
from fleet.transport.runner import MAX_LINE_BYTES, LineSplitter
from fleet.transport.shell import RemotePath

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.transport import Runner

log = logging.getLogger(__name__)


class Connects(Protocol):
    """What the follower needs of its link: the host's live connection, and a new one in
    place of a lost one (retried with backoff until the operation's deadline, or raised)."""

    def conn(self) -> Runner: ...

    def reconnect(self, step: str = "follow") -> Runner: ...


RS = b"\x1e"
_FOLLOW = (
    "exec 3<&0; f={{path}}; "
    "st=$(stat -L -c '%i %s' -- \"$f\" 2>/dev/null) || st='0 0'; "
    "printf '\\036FLEET %s %s\\036' {{token}} \"$st\"; "
    '( exec tail -c +{{start}} -F -- "$f" 2>/dev/null ) & t=$!; '
    '( cat <&3 >/dev/null 2>&1; kill "$t" 2>/dev/null ) & c=$!; '
    'while kill -0 "$t" 2>/dev/null && { [ {{pid}} -eq 0 ] || kill -0 {{pid}} 2>/dev/null; }; '
    "do sleep 1; done; "
    'sleep 1; kill "$t" 2>/dev/null; wait "$t" 2>/dev/null; kill "$c" 2>/dev/null; '
    "if [ {{pid}} -ne 0 ] && ! kill -0 {{pid}} 2>/dev/null; then "
    "printf '\\036FLEET-END %s\\036' {{token}}; fi"
)


def follow_command(path: str, *, start: int, pid: int, token: str) -> shell.Command:
    """The remote follow: header, ``tail -c +start -F``, the end marker when ``pid`` ends."""
    return shell.sh(
        shell.script(_FOLLOW, path=RemotePath(path), start=int(start), pid=int(pid), token=token)
    )


@dataclass
class FollowStats:
    """What a follow received: bytes, reconnects, rotations, and the sha256 of every byte
    in order (equal to the log's own prefix of that length: nothing lost or repeated)."""

    bytes: int = 0
    reconnects: int = 0
    rotations: int = 0
    notes: list[str] = field(default_factory=list)
    digest: Any = field(default_factory=hashlib.sha256, repr=False)

    @property
    def sha256(self) -> str:
        return str(self.digest.hexdigest())


class Ended(Exception):
    """The followed process exited (the remote side printed the end marker)."""


class LogFollower:
    """The bytes of a remote log from ``offset`` on, across reconnects.

    Iterate :meth:`chunks`: it yields log bytes, or ``b""`` every ``tick`` seconds of
    silence (so the caller can watch budgets and stalls), and returns when the followed
    process exits (:attr:`exited`) or after :meth:`close`. A broken stream is reopened
    from the next byte on the connection the link gives (``link.reconnect``: backoff until
    the operation's deadline; past it, the last connection fault is raised)."""

    def __init__(
        self,
        link: Connects,
        host: HostSpec,
        path: str,
        *,
        pid: int = 0,
        offset: int = 0,
        inode: int | None = None,
        tick: float = 1.0,
    ) -> None:
        self.link = link
        self.host = host
        self.path = path
        self.pid = pid
        self.offset = offset
        self.inode = inode
        self.tick = tick
        self.exited = False
        self.stats = FollowStats()
        self._closed = False

    def close(self) -> None:
        self._closed = True

    def chunks(self) -> Iterator[bytes]:
        conn: Runner = self.link.conn()
        while not self._closed and not self.exited:
            try:
                yield from self._one_stream(conn)
                if self._restart:  # rotated or truncated: again, from the new start
                    self._restart = False
                    continue
                return
            except ConnectError as exc:
                if self._closed:
                    return
                self.stats.reconnects += 1
                log.info("%s: the follow of %s broke at byte %d (%s): resuming",
                         self.host.name, self.path, self.offset, exc.message)  # fmt: skip
                conn = self.link.reconnect("follow")

    _restart = False

    def _one_stream(self, conn: Runner) -> Iterator[bytes]:
        """One remote stream: its header (a rotation check), then bytes until its end."""
        token = _secrets.token_hex(8)
        head = RS + b"FLEET " + token.encode() + b" "
        end = RS + b"FLEET-END " + token.encode() + RS
        keep = len(end) - 1  # a marker split across two chunks stays in the buffer
        command = follow_command(self.path, start=self.offset + 1, pid=self.pid, token=token)
        stream = conn.stream_bytes(command, timeout=self.tick, tick=True)
        buf = b""
        header = False
        try:
            for data in stream:
                if self._closed:
                    return
                if not data:
                    yield b""
                    continue
                buf += data
                if not header:
                    start = buf.find(head)
                    stop = buf.find(RS, start + len(head)) if start >= 0 else -1
                    if stop < 0:
                        continue
                    if self._rotated(buf[start + len(head) : stop].split()):
                        self._restart = True
                        return
                    buf = buf[stop + 1 :]
                    header = True
                cut = buf.find(end)
                if cut >= 0:
                    yield from self._take(buf[:cut])
                    self.exited = True
                    return
                # hold back only what could be the start of the end marker (a record
                # separator near the end): every other byte goes out at once
                held = buf.rfind(RS, max(0, len(buf) - keep))
                if held >= 0 and end.startswith(buf[held:]):
                    yield from self._take(buf[:held])
                    buf = buf[held:]
                else:
                    yield from self._take(buf)
                    buf = b""
            # no end marker: the connection (or the remote follow) broke; what came is kept
            if header:
                yield from self._take(buf)
            if not self._closed:
                raise _Dropped(self.host.name, "the log stream ended without its end marker")
        finally:
            stream.close()

    def _take(self, data: bytes) -> Iterator[bytes]:
        if data:
            self.offset += len(data)
            self.stats.bytes += len(data)
            self.stats.digest.update(data)
            yield data

    def _rotated(self, fields: list[bytes]) -> bool:
        try:
            inode, size = int(fields[0]), int(fields[1])
        except (IndexError, ValueError):
            return False
        rotated = self.inode is not None and inode not in (0, self.inode)
        truncated = size < self.offset
        if inode:
            self.inode = inode
        if not (rotated or truncated):
            return False
        what = "rotated" if rotated else "truncated"
        self.stats.rotations += 1
        self.stats.digest = hashlib.sha256()  # the new log's bytes from its first one
        self.stats.notes.append(
            f"{self.path} was {what} at byte {self.offset}: following the new log from its start"
        )
        self.offset = 0
        return True


class _Dropped(ConnectError):
    code = "connection-lost"


class PhysicalLines(LineSplitter):
    """Physical lines of a log fed in chunks, split on ``\\n`` AND ``\\r`` (tqdm redraws a
    bar with ``\\r``; CUDA-graph capture is one line of ``\\r``-separated updates); empty
    lines are skipped; long lines cut as :class:`~fleet.transport.runner.LineSplitter`
    cuts them."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        super().__init__(max_line, breaks=b"\r\n", keep_empty=False)

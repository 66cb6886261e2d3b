"""The serve log follower: the physical-line splitter (pure) and LogFollower on a real local
shell (``tail -F`` under the guard, as over SSH): every byte once across dropped streams, the
end marker when the process exits, rotation and truncation."""

from __future__ import annotations

import os
import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleet.errors import ConnectError
from fleet.inventory import HostSpec
from fleet.transport import shell
from fleet.transport.follow import LogFollower, PhysicalLines
from fleet.transport.runner import LocalRunner


def reference(data: bytes) -> list[str]:
    return [p.decode("utf-8", "replace") for p in re.split(rb"[\r\n]", data) if p]


@pytest.mark.parametrize("seed", range(20))
def test_lines_do_not_depend_on_where_the_chunks_break(seed: int) -> None:
    rng = random.Random(seed)
    pieces = [b"INFO a", b"\n", b"\r", b"Loading 12%|##", b"\r\n", "é".encode(), b"x" * 50]
    data = b"".join(rng.choice(pieces) for _ in range(200)) + b"\n"
    splitter = PhysicalLines()
    got: list[str] = []
    at = 0
    while at < len(data):
        step = rng.randint(1, 40)
        got += splitter.feed(data[at : at + step])
        at += step
    # a chunk boundary inside a multi-byte character must not change the text
    assert got == reference(data)
    assert splitter.pending == 0


def test_an_endless_line_is_cut_and_memory_stays_bounded() -> None:
    splitter = PhysicalLines(max_line=1000)
    out: list[str] = []
    for _ in range(500):  # 5 MB without a line end
        out += splitter.feed(b"\0" * 10_000)
        assert splitter.pending <= 1000
    out += splitter.feed(b" rest of the long line\nINFO next\r")
    assert out == ["\0" * 1000, "INFO next"]


def test_a_line_exactly_at_the_cap_is_kept_whole() -> None:
    splitter = PhysicalLines(max_line=8)
    assert splitter.feed(b"12345678\n123456789\nok\n") == ["12345678", "12345678", "ok"]


class Cuts:
    """A session over a real local runner whose log streams break after ``every`` chunks
    (as a dropped SSH connection does: ConnectError from the stream)."""

    def __init__(self, runner: LocalRunner, every: int) -> None:
        self.runner = runner
        self.every = every
        self.reconnects = 0

    def conn(self) -> Any:
        return self

    def reconnect(self, step: str = "follow") -> Any:
        self.reconnects += 1
        return self

    @property
    def host(self) -> HostSpec:
        return self.runner.host

    def stream_bytes(
        self, command: shell.Command | Sequence[str], *, timeout: float | None, tick: bool
    ) -> Iterator[bytes]:
        stream = self.runner.stream_bytes(command, timeout=timeout, tick=tick)
        seen = 0
        try:
            for data in stream:
                yield data
                if data:
                    seen += 1
                    if seen >= self.every:
                        raise ConnectError(self.host.name, "cut by the test")
        finally:
            stream.close()


def writer(log: Path, count: int, pause: float) -> subprocess.Popen[bytes]:
    """A process that appends ``count`` numbered lines to ``log``, then exits; reaped at
    once (as supervisord reaps vLLM), since ``kill -0`` finds a zombie alive."""
    script = f'i=1; while [ $i -le {count} ]; do echo "line $i"; i=$((i+1)); sleep {pause}; done'
    with open(log, "ab") as fh:
        proc = subprocess.Popen(["sh", "-c", script], stdout=fh)
    threading.Thread(target=proc.wait, daemon=True).start()
    return proc


def follow_all(follower: LogFollower, limit_s: float = 30) -> list[str]:
    """Every line until the followed process exits (the end marker); fails after
    ``limit_s``."""
    splitter = PhysicalLines()
    lines: list[str] = []
    deadline = time.monotonic() + limit_s
    for chunk in follower.chunks():
        lines += splitter.feed(chunk)
        if time.monotonic() > deadline:
            follower.close()
    assert follower.exited, f"no end marker within {limit_s} s"
    return lines


def test_every_line_once_across_dropped_streams_and_the_end_when_the_process_exits(
    tmp_path: Path,
) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    proc = writer(log, 120, 0.01)
    session = Cuts(LocalRunner(), every=3)
    follower = LogFollower(session, session.host, str(log), pid=proc.pid, tick=0.2)
    lines = follow_all(follower)
    assert follower.exited
    assert lines == [f"line {i}" for i in range(1, 121)]
    assert follower.offset == log.stat().st_size == follower.stats.bytes
    assert session.reconnects == follower.stats.reconnects >= 2


def test_a_follow_resumes_from_its_offset(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"old 1\nold 2\n")
    proc = writer(log, 3, 0.05)
    session = Cuts(LocalRunner(), every=10**6)
    follower = LogFollower(session, session.host, str(log), pid=proc.pid, offset=12, tick=0.2)
    assert follow_all(follower) == ["line 1", "line 2", "line 3"]


def test_a_rotated_log_is_followed_from_its_new_start(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"before rotation\n")
    inode = log.stat().st_ino
    os.rename(log, tmp_path / "vllm.log.1")
    log.write_bytes(b"")
    proc = writer(log, 2, 0.05)
    session = Cuts(LocalRunner(), every=10**6)
    follower = LogFollower(
        session, session.host, str(log), pid=proc.pid, offset=16, inode=inode, tick=0.2
    )
    lines = follow_all(follower)
    assert lines == ["line 1", "line 2"]
    assert follower.stats.rotations == 1
    assert "was rotated at byte 16" in follower.stats.notes[0]


def test_a_truncated_log_is_followed_from_its_first_byte(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    proc = writer(log, 2, 0.05)
    session = Cuts(LocalRunner(), every=10**6)
    follower = LogFollower(session, session.host, str(log), pid=proc.pid, offset=10**6, tick=0.2)
    lines = follow_all(follower)
    assert lines == ["line 1", "line 2"]
    assert "was truncated at byte 1000000" in follower.stats.notes[0]


def test_a_log_line_cannot_forge_the_end_marker(tmp_path: Path) -> None:
    """The end marker carries a random token per stream: a log line that prints a marker
    with another token is log text, and the follow goes on until the process exits."""
    log = tmp_path / "vllm.log"
    log.write_bytes(b"\x1eFLEET-END 0123456789abcdef\x1e\n")
    proc = writer(log, 2, 0.2)
    session = Cuts(LocalRunner(), every=10**6)
    follower = LogFollower(session, session.host, str(log), pid=proc.pid, tick=0.2)
    lines = follow_all(follower)
    assert lines[-2:] == ["line 1", "line 2"]
    assert lines[0] == "\x1eFLEET-END 0123456789abcdef\x1e"

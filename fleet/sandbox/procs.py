"""Processes the sandbox started: identified by pid files plus a start-time token, never by name.

A pid alone can be recycled; a pid together with the kernel's start time of that process
cannot. ``ProcessRecord`` holds both, and every signal goes to a process only after its
start time has been checked again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

_HAS_PROC = Path("/proc/self/stat").exists()


def start_token(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (None if there is no such process)."""
    if pid <= 0:
        return None
    if _HAS_PROC:
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        # comm (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = raw[raw.rfind(")") + 2 :].split()
        # state is field 3 (index 0 here); starttime is field 22 (index 19).
        if fields[0] in ("Z", "X"):
            return None
        return fields[19]
    try:
        out = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return None
    return out or None


def parent_map() -> dict[int, int]:
    """pid -> parent pid for every process visible to us."""
    parents: dict[int, int] = {}
    if _HAS_PROC:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rfind(")") + 2 :].split()
            parents[int(entry)] = int(fields[1])
        return parents
    out = subprocess.run(
        ["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            parents[int(parts[0])] = int(parts[1])
    return parents


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended: a zombie (ended, not yet reaped by
    its parent) is not running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree (children first, breadth-first)."""
    children: dict[int, list[int]] = {}
    for child, parent in parent_map().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    queue = list(children.get(pid, []))
    while queue:
        current = queue.pop(0)
        if current in found or current == pid:
            continue
        found.append(current)
        queue.extend(children.get(current, []))
    return found


@dataclass(frozen=True)
class ProcessRecord:
    """A process we started (or one below it): pid and start-time token."""

    pid: int
    token: str

    @classmethod
    def of(cls, pid: int) -> ProcessRecord | None:
        token = start_token(pid)
        return cls(pid, token) if token is not None else None

    def alive(self) -> bool:
        _reap(self.pid)
        return start_token(self.pid) == self.token

    def signal(self, sig: int) -> bool:
        """Send ``sig`` if this is still the same process; True if it was sent."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        return True

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "start": self.token})

    @classmethod
    def from_json(cls, text: str) -> ProcessRecord | None:
        try:
            data = json.loads(text)
            return cls(int(data["pid"]), str(data["start"]))
        except (ValueError, KeyError, TypeError):
            return None


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is an exited child of this process (no zombie left behind)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_tree(root: ProcessRecord, *, kill: bool = False, timeout: float = 5.0) -> list[int]:
    """Stop ``root`` and every process below it; SIGKILL what outlives ``timeout``.

    The tree is read before the first signal (children are re-parented once their parent
    dies). Returns the pids that were signalled.
    """
    if not root.alive():
        return []
    tree = [root] + [r for r in (ProcessRecord.of(p) for p in descendants(root.pid)) if r]
    first = signal.SIGKILL if kill else signal.SIGTERM
    sent = [r for r in tree if r.signal(first)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(r.alive() for r in sent):
        time.sleep(0.02)
    for record in sent:
        if record.alive():
            record.signal(signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(r.alive() for r in sent):
        time.sleep(0.02)
    return [r.pid for r in sent]


def environ_of(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` was started with (Linux, same user), or None."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env

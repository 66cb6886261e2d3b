"""A ``fleet --json serve --events`` run as a real process that a test watches and hurts:
its events arrive as they happen, a fault is struck when a chosen event arrives, and the
final JSON document is parsed at the end. Shared by the serve fault tests and
benchmarks/bench_serve.py."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet.onhost.layout import log_path
from fleet.sandbox.core import Sandbox

PROFILE = "kimi-eagle3"
LOG = "~/" + log_path(PROFILE)
Match = Callable[[dict[str, Any]], bool]


def on_step(name: str, nth: int = 1) -> Match:
    """The ``nth`` event that starts step ``name`` (``preflight``, ``launch``,
    ``readiness:metrics``...)."""
    seen = [0]

    def match(event: dict[str, Any]) -> bool:
        if event.get("event") == "step" and event.get("step") == name:
            seen[0] += 1
            return seen[0] == nth
        return False

    return match


def on_phase(name: str) -> Match:
    return lambda e: e.get("event") == "phase" and e.get("phase") == name


@dataclass
class ServeRun:
    box: Sandbox
    host: str
    args: tuple[str, ...] = ()
    verbose: bool = False
    profile: str = PROFILE
    events: list[dict[str, Any]] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None
    _rest: list[str] = field(default_factory=list)
    _hooks: list[tuple[Match, Callable[[dict[str, Any]], None]]] = field(default_factory=list)
    _reader: threading.Thread | None = None
    errors: list[BaseException] = field(default_factory=list)

    def when(self, match: Match, action: Callable[[dict[str, Any]], None]) -> ServeRun:
        """Run ``action(event)`` (in a thread of its own) on the first event ``match``es."""
        self._hooks.append((match, action))
        return self

    def start(self) -> ServeRun:
        cmd = [*self.box.fleet_argv(), *(["-v"] if self.verbose else []), "--json", "serve",
               self.profile, "--host", self.host, "--events", *self.args]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=self.box.fleet_env(),
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        pending = list(self._hooks)
        for line in self.proc.stdout:
            event = None
            if line.startswith('{"host"'):
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
            if event is None or "event" not in event:
                self._rest.append(line)
                continue
            self.events.append(event)
            for hook in list(pending):
                match, action = hook
                if match(event):
                    pending.remove(hook)
                    threading.Thread(target=self._act, args=(action, event), daemon=True).start()

    def _act(self, action: Callable[[dict[str, Any]], None], event: dict[str, Any]) -> None:
        try:
            action(event)
        except BaseException as exc:  # reported by finish()
            self.errors.append(exc)

    def interrupt(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 300) -> tuple[int, dict[str, Any], str]:
        """(exit code, the host's entry of the final JSON document, stderr)."""
        assert self.proc is not None and self._reader is not None
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(timeout=30)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        assert not self.errors, self.errors
        text = "".join(self._rest).strip()
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            raise AssertionError(f"no JSON (exit {code}): {text!r}\n{err}") from None
        return code, (doc.get("hosts") or {}).get(self.host, {}), err

    def event(self, kind: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == kind), None)


def cut_while_a_script_runs(box: Sandbox, host: str, *, wait_s: float = 15.0) -> int:
    """Cut the host's SSH sessions as soon as one of fleet's on-host scripts runs there
    (so the cut lands inside that step, not before it); returns the sessions cut."""
    deadline = time.monotonic() + wait_s
    while box.onhost_scripts(host) == 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"no on-host script ran on {host} within {wait_s}s")
        time.sleep(0.01)
    return box.cut_sessions(host)


def launches(box: Sandbox, host: str) -> int:
    """How many times vLLM started for the profile: its ``non-default args`` line, once
    per start, in the log and the one rotated before it."""
    text = box.on_host(host, f"cat {LOG}.1 {LOG} 2>/dev/null || true").stdout
    return text.count("non-default args")


def fresh_logs(box: Sandbox, host: str) -> None:
    box.on_host(host, f"rm -f {LOG} {LOG}.1")


def log_prefix_sha256(box: Sandbox, host: str, size: int) -> str:
    data = box.on_host(host, ["head", "-c", str(size), LOG.replace("~/", "")]).stdout_bytes
    return hashlib.sha256(data).hexdigest()


def vllm_processes(box: Sandbox, host: str) -> int:
    """vLLM servers of this host's own environment (local sandbox hosts share this
    machine's process table: a pattern without the host's home would count the others')."""
    exe = f"{box.host(host).home}/[m]l-env/bin/vllm serve"  # [m]: not the pgrep's own shell
    out = box.on_host(host, ["pgrep", "-c", "-f", exe], check=False).stdout.strip()
    return int(out or 0)

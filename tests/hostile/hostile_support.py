"""Helpers of the hostile suite (see conftest.py): the tally, the in-process CLI runner,
time bounds.

The hostile suite: fault and fuzz tests for fleet's input (inventories, known_hosts,
secrets, host output) and for concurrent ``fleet trust``.

Every attempt is counted in a :class:`Tally` (category x outcome) and the table is printed
at the end of the run, e.g.::

    category                attempts  tracebacks  wrong exit  hangs  executions  data loss
    inventory (structured)      2000           0           0      0           0          0

Tests fail on any non-zero cell; the table is the evidence for the closing note.
``FLEET_HOSTILE_SCALE`` (default 1) multiplies the number of generated examples.

CLI paths run in-process: :func:`run_fleet` calls fleet's own entry point
(``fleet.cli.errors.run_cli``) inside click's ``CliRunner`` isolation, so stdout, stderr
and the exit code are exactly what a user would see, without a subprocess per example.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from click.testing import CliRunner

KINDS = ("tracebacks", "wrong exit", "hangs", "executions", "data loss", "leaks")
SCALE = max(1, int(os.environ.get("FLEET_HOSTILE_SCALE", "1") or "1"))
T = TypeVar("T")


@dataclass
class Counts:
    attempts: int = 0
    bad: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    examples: dict[str, list[str]] = field(default_factory=dict)


class Tally:
    """Counts attempts and failures per category (thread-safe)."""

    def __init__(self) -> None:
        self.categories: dict[str, Counts] = {}
        self._lock = threading.Lock()

    def attempt(self, category: str, n: int = 1) -> None:
        with self._lock:
            self.categories.setdefault(category, Counts()).attempts += n

    def bad(self, category: str, kind: str, example: str) -> None:
        assert kind in KINDS, kind
        with self._lock:
            counts = self.categories.setdefault(category, Counts())
            counts.bad[kind] += 1
            shown = counts.examples.setdefault(kind, [])
            if len(shown) < 3:
                shown.append(example[:300])

    def failures(self, category: str) -> dict[str, int]:
        counts = self.categories.get(category, Counts())
        return {k: v for k, v in counts.bad.items() if v}

    def table(self) -> list[str]:
        head = f"{'category':32} {'attempts':>8} " + " ".join(f"{k:>10}" for k in KINDS)
        rows = [head, "-" * len(head)]
        for name, c in sorted(self.categories.items()):
            cells = " ".join(f"{c.bad[k]:>10}" for k in KINDS)
            rows.append(f"{name:32} {c.attempts:>8} {cells}")
        for name, c in sorted(self.categories.items()):
            for kind, shown in c.examples.items():
                for example in shown:
                    rows.append(f"  {name} / {kind}: {example}")
        return rows


TALLY = Tally()
"""The run's tally (one per process; the conftest prints it at the end)."""


# -- helpers ----------------------------------------------------------------------------


@dataclass
class CliRun:
    code: int | None
    stdout: str
    stderr: str
    error: BaseException | None = None  # an exception that escaped fleet's entry point
    trace: str = ""

    @property
    def traceback(self) -> bool:
        return self.error is not None or "Traceback (most recent call last)" in (
            self.stdout + self.stderr
        )


def run_fleet(args: list[str], env: dict[str, str | None] | None = None) -> CliRun:
    """``fleet ARGS`` in-process through fleet's entry point, output captured."""
    from fleet.cli import cli
    from fleet.cli.errors import run_cli

    runner = CliRunner()
    error: BaseException | None = None
    trace = ""
    code: int | None = None
    with runner.isolation(env=env) as (out, err, _mixed):
        try:
            code = run_cli(cli, args)
        except SystemExit as exc:  # click may exit for --help/--version
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # escaped: the test records it as a traceback
            error = exc
            trace = traceback.format_exc()
        stdout = out.getvalue().decode("utf-8", "replace")
        stderr = err.getvalue().decode("utf-8", "replace")
    return CliRun(code, stdout, stderr, error, trace)


def one_line_error(run: CliRun) -> bool:
    """A refusal as the contract says: exactly one line on stderr, ``fleet: error: ...``."""
    lines = run.stderr.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("fleet: error: ")


def usage_error(run: CliRun) -> bool:
    """click's refusal of an option value (exit 2): its usage lines and one ``Error:``."""
    lines = run.stderr.strip().splitlines()
    return sum(line.startswith("Error: ") for line in lines) == 1 and "Traceback" not in run.stderr


class Hung(Exception):
    pass


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()`` in a daemon thread; raises :class:`Hung` when it takes longer."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise Hung(f"still running after {time.monotonic() - started:.1f}s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


# -- processes on sandbox hosts ---------------------------------------------------------


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()[0].decode()


def remote_processes(box: Any) -> dict[str, list[str]]:
    """Live processes started over SSH on each host of a local-backend sandbox, by host:
    every process with the host's home as ``HOME`` (zombies are dead: left out)."""
    if getattr(box.state, "backend", "local") != "local":
        import pytest

        pytest.skip("the leftover check reads /proc of local sandbox hosts")
    homes = {f"HOME={h.home}".encode(): h.name for h in box.hosts}
    found: dict[str, list[str]] = {h.name: [] for h in box.hosts}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        for var in env:
            if var in homes and _state(int(entry)) not in (None, "Z", "X"):
                found[homes[var]].append(f"{entry} {cmd[:160]}")
    return found


def leftovers(
    box: Any, *, settle: float = 5.0, keep: Callable[[str], bool] | None = None
) -> list[str]:
    """Processes still running on the sandbox's hosts once ``settle`` seconds have passed
    (the hosts end a command's process group asynchronously); ``keep`` marks processes
    that are meant to outlive a command (a server under its supervisor)."""
    deadline = time.monotonic() + settle
    while True:
        left = [
            f"{host}: {proc}"
            for host, procs in remote_processes(box).items()
            for proc in procs
            if keep is None or not keep(proc)
        ]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)

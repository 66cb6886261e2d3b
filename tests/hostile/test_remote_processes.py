"""Every remote process fleet starts ends when fleet's command ends: Ctrl-C at random
points, SIGKILL, timeouts and errors, on real sshd hosts, with a check for leftover
processes on the hosts after each attempt (issue 10, defect 3).

The commands run long enough to be caught in the middle: ``logs --diagnose`` of a large
log whose every line is a candidate, ``source grep`` of a backreference regex over a
file in the vLLM tree (seconds of CPU per MiB), ``logs --follow`` (never ends by itself),
next to the quick ones (``inspect``, ``ping``, ``logs --tail``). A leftover is any live
process whose ``HOME`` is a sandbox host's home (every process started over the
sandbox's SSH has it).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hostile_support import SCALE, Tally, leftovers, remote_processes

from fleet.errors import OperationFailed
from fleet.sandbox.procs import running

pytestmark = pytest.mark.integration

SLOW_REGEX = r"^(.+)(.+)\2\1$"  # a backreference: grep's slow matcher on every line
OOM = "ERROR 11-02 10:15:01 [core.py:708] torch.OutOfMemoryError: CUDA out of memory.\n"
HANG_SECONDS = 30.0


@pytest.fixture(scope="module")
def box(sandbox_factory: Any) -> Any:
    """Two hosts; host 1 holds a large log, a small log and a slow file in its tree."""
    sandbox = sandbox_factory(2, ("0.17.0",), name="procs")
    remote_processes(sandbox)  # skips unless the hosts are local (the check reads /proc)
    first = sandbox.hosts[0]
    home = Path(first.home)
    block = OOM * 4096
    with open(home / "big.log", "w") as fh:
        for _ in range(120 * 2**20 // len(block)):
            fh.write(block)
    (home / "small.log").write_text("INFO starting\n" * 20)
    tree = next(home.glob("ml-env/lib/python3*/site-packages/vllm"))
    # grep's backreference matcher backtracks on every line of repeated words: ~12 ms a
    # line here, so ~50 s for the file; every test that uses it ends it long before then
    line = "x = " + repr("some ordinary python source text " * 5) + "\n"
    (tree / "hostile_slow.py").write_text(line * 4_000)
    return sandbox


def _commands(box: Any) -> list[tuple[str, list[str], int | None]]:
    """(label, argv, the exit code when it runs to its end; None: it never ends)."""
    first = box.hosts[0]
    big, small = f"{first.home}/big.log", f"{first.home}/small.log"
    h = first.name
    return [
        ("logs --diagnose", ["logs", "--host", h, "--path", big, "--diagnose"], 1),
        ("source grep", ["source", "grep", "--host", h, SLOW_REGEX, "hostile_slow.py"], 0),
        ("logs --follow", ["logs", "--host", h, "--path", small, "--follow"], None),
        ("inspect", ["inspect", "--host", "all"], 0),
        ("ping", ["ping", "--host", "all"], 0),
        ("logs --tail", ["logs", "--host", "all", "--path", small, "--tail", "5"], 0),
    ]


def _fleet(box: Any, args: list[str]) -> subprocess.Popen[str]:
    """``python -m fleet`` as a user runs it (the console entry point's handlers)."""
    cmd = [sys.executable, "-m", "fleet", "--inventory", str(box.inventory_path), *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=box.fleet_env()
    )


def _alive(proc: subprocess.Popen[str]) -> bool:
    return running(proc.pid)


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str] | None:
    try:
        return proc.communicate(timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None


def test_ctrl_c_at_random_points_leaves_nothing_running(box: Any, tally: Tally) -> None:
    category = "Ctrl-C at random points"
    rng = random.Random(1010)
    commands = _commands(box)
    caught_running = 0
    for i in range(14 * SCALE):
        label, args, normal = (
            commands[i % len(commands)] if i < len(commands) else (rng.choice(commands))
        )
        quick = normal is not None and label in ("inspect", "ping", "logs --tail")
        delay = rng.uniform(0.05, 1.0 if quick else 3.0)
        proc = _fleet(box, args)
        time.sleep(delay)
        busy = sum(len(p) for p in remote_processes(box).values())
        signalled = _alive(proc)
        if signalled:
            proc.send_signal(signal.SIGINT)
            caught_running += busy > 0
        tally.attempt(category)
        done = _finish(proc)
        where = f"{label} at {delay:.2f}s"
        if done is None:
            tally.bad(category, "hangs", where)
            continue
        _out, err = done
        if "Traceback" in err:
            tally.bad(category, "tracebacks", f"{where}: {err[-300:]}")
        interrupted = proc.returncode == 130 and "fleet: interrupted" in err
        finished = proc.returncode == normal and "interrupted" not in err
        if not (interrupted or (finished and not signalled) or (finished and quick)):
            tally.bad(category, "wrong exit", f"{where}: exit {proc.returncode}: {err[-200:]}")
        left = leftovers(box)
        if left:
            tally.bad(category, "leaks", f"{where}: {left}")
    assert not tally.failures(category), tally.categories[category].examples
    assert caught_running >= 3, "too few attempts caught a remote process running"


def test_fleet_killed_outright_leaves_nothing_running(box: Any, tally: Tally) -> None:
    """SIGKILL: no handler runs, the connection just drops; the hosts end the commands."""
    category = "SIGKILL mid-command"
    for label, args, _normal in _commands(box)[:3]:
        proc = _fleet(box, args)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(remote_processes(box).values()):
            time.sleep(0.05)
        tally.attempt(category)
        running = sum(len(p) for p in remote_processes(box).values())
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=HANG_SECONDS)
        assert running, f"{label}: nothing ran on the host"
        left = leftovers(box)
        if left:
            tally.bad(category, "leaks", f"{label}: {left}")
    assert not tally.failures(category), tally.categories[category].examples


def test_timeouts_and_errors_end_what_they_started(box: Any, tally: Tally) -> None:
    """Library paths: a command past its timeout, an on-host script past its timeout, a
    stream closed early, a stream whose reader fails."""
    from fleet.inventory import load_inventory
    from fleet.onhost.client import run_raw
    from fleet.transport import Session, shell

    category = "timeouts and errors"
    inventory = load_inventory(box.inventory_path)
    spec = inventory.hosts[box.hosts[0].name]
    loop = shell.sh("while :; do echo tick; sleep 0.1; done")
    with Session(inventory) as session:
        conn = session.connect(spec)
        cases: list[tuple[str, Any]] = [
            ("run past its timeout", lambda: conn.run(shell.sh("sleep 60 | cat"), timeout=1)),
            (
                "on-host script past its timeout",
                lambda: run_raw(
                    conn,
                    "source",
                    {
                        "op": "grep",
                        "path": "hostile_slow.py",
                        "regex": SLOW_REGEX,
                        "time_limit": 60,
                    },
                    timeout=2,
                ),
            ),
        ]
        for what, call in cases:
            tally.attempt(category)
            with pytest.raises(OperationFailed, match="timed out"):
                call()
            left = leftovers(box)
            if left:
                tally.bad(category, "leaks", f"{what}: {left}")
        tally.attempt(category)
        stream = conn.stream(loop)
        assert next(stream) == "tick"
        stream.close()
        left = leftovers(box)
        if left:
            tally.bad(category, "leaks", f"stream closed early: {left}")
        tally.attempt(category)
        with pytest.raises(ZeroDivisionError):
            for _line in conn.stream(loop):
                _ = 1 / 0
        left = leftovers(box)
        if left:
            tally.bad(category, "leaks", f"stream reader failed: {left}")
        # the connection is still good for the next command, and that one ends too
        assert conn.run(["true"], timeout=30).ok
    assert not tally.failures(category), tally.categories[category].examples


def test_an_orphaned_tool_is_never_left_when_the_connection_drops(box: Any, tally: Tally) -> None:
    """The SSH session itself dies (sshd killed): the commands' stdin ends too."""
    from fleet.inventory import load_inventory
    from fleet.transport import Session, shell

    category = "timeouts and errors"
    inventory = load_inventory(box.inventory_path)
    name = box.hosts[1].name
    tally.attempt(category)
    with Session(inventory) as session:
        conn = session.connect(inventory.hosts[name])
        stream = conn.stream_bytes(shell.sh("sleep 120"), timeout=0.5, tick=True)
        assert next(stream) == b""  # the command runs (silently)
        assert remote_processes(box)[name], "the command did not start"
        # the client side vanishes without closing the channel: the socket is shut down
        conn.fabric.client.get_transport().sock.shutdown(2)  # type: ignore[union-attr]
        stream.close()
    left = leftovers(box, settle=10.0)
    if left:
        tally.bad(category, "leaks", f"connection dropped: {left}")
    assert not left

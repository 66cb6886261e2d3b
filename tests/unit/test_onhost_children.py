"""The tools an on-host script starts end with it when fleet goes away, in every timing.

Two gaps a leak came through (a `grep` left running after `fleet source grep` was killed):
fleet's SIGTERM arriving while the tool was being started (before the script knew its
pid), and a main thread that could not run its clean-up before the watchdog's last resort
(``os._exit``). Each case runs the real runtime (``fleet/onhost/_common.py``, as bundled)
in its own interpreter and checks that the started ``sleep`` is gone.
"""

from __future__ import annotations

import subprocess
import sys
import time

from fleet.onhost import client
from fleet.sandbox.procs import running

COMMON = client.bundle("_common").text

SIGTERM_WHILE_STARTING = """
import signal, subprocess, time
signal.signal(signal.SIGTERM, _terminated)
real = subprocess.Popen

class Popen(real):
    def __init__(self, *args, **kwargs):
        real.__init__(self, *args, **kwargs)
        print(self.pid, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)  # fleet goes away now: the pid is not kept yet
        time.sleep(0.2)  # the handler runs here, in the middle of the start

subprocess.Popen = Popen
try:
    start_group(["sleep", "60"])
except SystemExit as exc:
    print("exit", exc.code, flush=True)
    raise
print("not ended", flush=True)
"""

MAIN_THREAD_STUCK = """
import signal, threading, time
r, w = os.pipe()
_fleet_stdin = os.fdopen(r, "rb")
GRACE_S = 0.3
watch_fleet()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # its handler never runs
proc = start_group(["sleep", "60"])
print(proc.pid, flush=True)
os.close(w)  # fleet is gone: EOF
time.sleep(30)
print("not ended", flush=True)
"""


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.02)
    return False


def _run(script: str) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", COMMON + script], capture_output=True, text=True, timeout=60
    )
    return proc.returncode, proc.stdout.split()


def test_a_sigterm_while_a_tool_starts_ends_the_tool_too() -> None:
    code, out = _run(SIGTERM_WHILE_STARTING)
    pid = int(out[0])
    try:
        assert out[1:] == ["exit", "143"] and code == 143
        assert _gone_within(pid, 5.0), f"sleep {pid} outlived the script"
    finally:
        if running(pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)


def test_the_watchdogs_last_resort_ends_the_tools_too() -> None:
    code, out = _run(MAIN_THREAD_STUCK)
    pid = int(out[0])
    try:
        assert code == 143 and "not ended" not in out
        assert _gone_within(pid, 5.0), f"sleep {pid} outlived the script"
    finally:
        if running(pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)

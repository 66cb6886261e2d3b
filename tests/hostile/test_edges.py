"""Edges (issue 10, defect 13): huge numbers are bad input at parse time, and a Ctrl-C is
never lost or turned into a crash, wherever it lands.

The Ctrl-C cases run fleet's real console entry point (``fleet.console.main`` ->
``fleet.cli.errors.main_exit``) in a child process, with a click command that lands the
signal where the issue found it mishandled: while the command cleans up after its
result, in a handler that swallows ``KeyboardInterrupt``, in the error path, twice in a
row, and after the command has returned.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hostile_support import Tally, one_line_error, run_fleet, usage_error

HUGE = ["10000001", "18446744073709551617", "99999999999999999999999", "1e30", "-1", "0", "nan"]


def test_huge_numbers_are_refused_at_parse_time(tmp_path: Path, tally: Tally) -> None:
    category = "huge values"
    inv = tmp_path / "inventory.yaml"
    inv.write_text("all:\n  hosts:\n    h1: {address: 10.255.255.1}\n")  # never reached
    cases: list[list[str]] = []
    for value in HUGE:
        cases.append(["logs", "--host", "h1", "--path", "/x.log", "--tail", value])
        cases.append(["logs", "--host", "h1", "--path", "/x.log", "--tail", value, "--diagnose"])
        cases.append(["source", "grep", "--host", "h1", "x", "--limit", value])
        cases.append(["source", "grep", "--host", "h1", "x", "--max-count", value])
        cases.append(["serve", "kimi-eagle3", "--host", "h1", "--timeout", value])
        cases.append(["serve", "kimi-eagle3", "--host", "h1", "--stall-timeout", value])
    for value in ("18446744073709551617", "2147483648", "1-99999999999999999999", "0-5"):
        cases.append(["source", "show", "--host", "h1", f"_version.py:{value}"])
    for value in ("inf", "-inf", "1e400"):
        cases.append(["serve", "kimi-eagle3", "--host", "h1", "--timeout", value])
    for args in cases:
        tally.attempt(category)
        run = run_fleet(["--inventory", str(inv), *args])
        if run.traceback:
            tally.bad(category, "tracebacks", f"{args}: {run.trace or run.stderr[-200:]}")
        if (args[-1] == "0" and "--limit" in args) or run.code == 0:
            continue  # --limit 0 means "no limit"
        if run.code != 2 or not (one_line_error(run) or usage_error(run)):
            tally.bad(category, "wrong exit", f"{args}: exit {run.code}: {run.stderr[-200:]}")
    assert not tally.failures(category), tally.categories[category].examples


CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import click
    from fleet.errors import UsageError

    case = sys.argv[1]

    def interrupt(after=0.0, times=1):
        def send():
            time.sleep(after)
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        threading.Thread(target=send, daemon=True).start()

    @click.command()
    def cli():
        if case == "during cleanup":
            click.get_current_context().call_on_close(lambda: (interrupt(), time.sleep(2)))
            print("result")
            return 0
        if case == "swallowed":
            try:
                interrupt()
                time.sleep(2)
            except BaseException:
                pass  # a library that eats KeyboardInterrupt
            print("result")
            return 0
        if case == "in the error path":
            click.get_current_context().call_on_close(lambda: (interrupt(), time.sleep(2)))
            raise UsageError("bad input")
        if case == "twice":
            def cleanup():
                interrupt(times=2)
                time.sleep(5)  # a cleanup that hangs: the second Ctrl-C ends it
            click.get_current_context().call_on_close(cleanup)
            interrupt()
            time.sleep(2)
        if case == "after the result":
            interrupt(after=0.0)
            time.sleep(0.5)  # landed while "returning": the result was printed
            print("result")
            return 0
        return 0

    from fleet.cli.errors import main_exit
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main_exit(cli, [])
    """
)


@pytest.mark.parametrize(
    "case", ["during cleanup", "swallowed", "in the error path", "twice", "after the result"]
)
def test_a_ctrl_c_is_always_reported(case: str, tally: Tally) -> None:
    category = "Ctrl-C at the end of a run"
    tally.attempt(category)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, case],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        tally.bad(category, "hangs", case)
        raise
    if "Traceback" in proc.stderr:
        tally.bad(category, "tracebacks", f"{case}: {proc.stderr[-300:]}")
    if proc.returncode != 130 or proc.stderr.count("fleet: interrupted") != 1:
        tally.bad(category, "wrong exit", f"{case}: exit {proc.returncode}: {proc.stderr[-200:]!r}")
    assert not tally.failures(category), tally.categories[category].examples

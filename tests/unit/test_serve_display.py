"""What ``fleet serve`` prints to a pipe while it waits (not a terminal, not --json)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from fleet.cli.cmd_serve import Display
from fleet.cli.context import AppContext


def _display() -> tuple[Display, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    app = AppContext(inventory_path="unused", _console=console, _err_console=console)
    return Display(app, ["h1", "h2"], events=False), out


def _progress(host: str, done: int, t: float, phase: str = "weights") -> dict[str, Any]:
    return {
        "host": host,
        "event": "progress",
        "t": t,
        "phase": phase,
        "shards": {"done": done, "total": 64},
        "percent": done * 100 / 64,
        "eta_s": (64 - done) * 2.0,
    }


def test_a_pipe_gets_one_line_per_tenth_of_a_long_phase() -> None:
    display, out = _display()
    for done in range(65):  # every shard of a 64-shard load reported, some twice
        display(_progress("h1", done, t=done * 2.0))
        display(_progress("h1", done, t=done * 2.0 + 1))
    lines = out.getvalue().splitlines()
    assert len(lines) == 9, lines  # 10% ... 90%; 100% is the next phase's line
    assert lines[0] == "h1: [0:14] weights 7/64 shards (11%), ETA 1:54"
    assert lines[-1].startswith("h1: [1:56] weights 58/64 shards (91%)")


def test_each_host_and_each_phase_counts_its_own_tenths() -> None:
    display, out = _display()
    display(_progress("h1", 32, t=60))
    display(_progress("h2", 32, t=61))
    display(_progress("h1", 33, t=62))  # still 50%: nothing new
    # a later phase's events still carry the weights' shards and ETA: not shown there
    display({**_progress("h1", 64, t=70, phase="cuda-graphs"), "percent": 55.0})
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["h1", "h2", "h1"], lines
    assert lines[2] == "h1: [1:10] cuda-graphs (55%)"


def test_progress_without_a_percent_prints_nothing() -> None:
    display, out = _display()
    display({"host": "h1", "event": "progress", "t": 5, "phase": "compile", "percent": None})
    assert out.getvalue() == ""

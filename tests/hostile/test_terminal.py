"""Terminal escape sequences from hosts (issue 10, defect 12): ``source show/grep`` and
``logs`` show control characters as ``\\xNN``; ``--raw`` prints them as they are, and
``--json`` carries the exact text. Errors quoting host output or user input (a path, a
host's stderr) are escaped too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hostile_support import SCALE, Tally, run_fleet
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.cli.render import terminal_safe

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
NASTY = [
    "\x1b[2J\x1b[H cleared",
    "\x1b]0;window title\x07",
    "\x1b]8;;http://x.example\x1b\\link\x1b]8;;\x1b\\",
    "over\rWRITTEN",
    "\x9b31m C1 CSI",
    "bell\x07 backspace\x08\x08",
    "\x1bP tmux passthrough \x1b\\",
]


@settings(max_examples=500 * SCALE, deadline=None, database=None)
@given(st.text())
def test_terminal_safe_leaves_no_control_character(text: str) -> None:
    out = terminal_safe(text)
    assert not CONTROL.search(out)
    if not CONTROL.search(text):
        assert out == text  # printable text (tabs, newlines, Unicode) is left alone


@pytest.fixture(scope="module")
def box(sandbox_factory: Any) -> Any:
    sandbox = sandbox_factory(1, ("0.17.0",), name="terminal")
    home = Path(sandbox.hosts[0].home)
    tree = next(home.glob("ml-env/lib/python3*/site-packages/vllm"))
    body = "".join(f"marker {n} {text}\n" for n, text in enumerate(NASTY))
    (tree / "hostile_escapes.py").write_text(body)
    (home / "escapes.log").write_text(body)
    return sandbox


@pytest.mark.integration
def test_host_text_is_escaped_unless_raw(box: Any, tally: Tally) -> None:
    category = "terminal escapes"
    host = box.hosts[0].name
    inv = ["--inventory", str(box.inventory_path)]
    log = f"{box.hosts[0].home}/escapes.log"
    commands = {
        "source show": ["source", "show", "--host", host, "hostile_escapes.py"],
        "source grep": ["source", "grep", "--host", host, "marker", "hostile_escapes.py"],
        "logs": ["logs", "--host", host, "--path", log],
    }
    for label, args in commands.items():
        tally.attempt(category, 3)
        shown = run_fleet([*inv, *args])
        if shown.code != 0 or CONTROL.search(shown.stdout + shown.stderr):
            tally.bad(category, "executions", f"{label}: control characters reached the terminal")
        if "\\x1b[2J" not in shown.stdout:
            tally.bad(
                category, "wrong exit", f"{label}: the escape is not shown: {shown.stdout[:200]}"
            )
        raw = run_fleet([*inv, *args, "--raw"])
        if raw.code != 0 or not all(t.split("\n")[0] in raw.stdout for t in NASTY):
            tally.bad(category, "wrong exit", f"{label} --raw: not the host's bytes")
        doc = run_fleet([*inv, "--json", *args])
        texts = json.dumps(json.loads(doc.stdout))
        if doc.code != 0 or not all(json.dumps(t)[1:-1] in texts for t in NASTY):
            tally.bad(category, "wrong exit", f"{label} --json: not the exact text")
    # errors quoting user input or host output
    for label, args in {
        "a path in a logs error": ["logs", "--host", host, "--path", "/tmp/x\x1b[2Jy\x07"],
        "a path in a source error": ["source", "show", "--host", host, "a\x1b[31mb.py"],
        "a usage error": ["logs", "--host", "no\x1b[2Jsuch", "--path", "/x"],
    }.items():
        tally.attempt(category)
        run = run_fleet([*inv, *args])
        if run.code == 0 or run.traceback or CONTROL.search(run.stdout + run.stderr):
            tally.bad(category, "executions", f"{label}: {(run.stdout + run.stderr)[:200]!r}")
    assert not tally.failures(category), tally.categories[category].examples

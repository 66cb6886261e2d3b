"""Two ``fleet serve`` of one profile on one host at once: one launch.

A real sshd host, fleet's real supervisord (installed from the wheel fleet pushes), and
a stand-in ``vllm`` that only sleeps (``--no-wait --skip-preflight``: no model needed).
The server processes are counted on the host itself. Where supervisord cannot start on
this machine (its ``minfds`` above the hard open-files limit, e.g. in a container) the
test is skipped with the reason.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile_support import SCALE, Tally, leftovers, remote_processes

pytestmark = pytest.mark.integration

MARK = "313"  # the stand-in sleeps this many seconds: its processes are found by it


def _minfds() -> int:
    from fleet.paths import templates_dir

    text = (templates_dir() / "serve" / "supervisord.conf.j2").read_text()
    match = re.search(r"^minfds\s*=\s*(\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


@pytest.fixture(scope="module")
def box(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < _minfds():
        # local hosts inherit this process's limits; supervisord would refuse to start
        pytest.skip(f"supervisord's minfds={_minfds()} is above the open-files limit {hard}")
    sandbox = sandbox_factory(1, ("0.17.0",), name="serve-race")
    home = Path(sandbox.hosts[0].home)
    fake = home / "fake-vllm"
    fake.write_text(f"#!/bin/sh\nexec sleep {MARK}\n")
    fake.chmod(0o755)
    work = tmp_path_factory.mktemp("serve-race")
    (work / "playbooks").mkdir()
    (work / "playbooks" / "race.yaml").write_text(
        "name: race\nmodel: /nonexistent/target\nserved_model_name: race\n"
        "tensor_parallel_size: 1\nport: 45993\n"
        "speculative: {model: /nonexistent/drafter, num_speculative_tokens: 2}\n"
        f"vllm: {fake}\nstop_grace_s: 5\n"
    )
    sandbox.race_dir = work
    return sandbox


def _fleet(box: Any, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "fleet", "--inventory", str(box.inventory_path), "--json", *args]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=box.fleet_env(),
        cwd=box.race_dir,
    )


def _servers(box: Any) -> list[str]:
    return [p for procs in remote_processes(box).values() for p in procs if f"sleep {MARK}" in p]


def _entry(out: str, host: str) -> dict[str, Any]:
    return json.loads(out)["hosts"][host] if out.strip() else {}


def test_two_serves_of_one_profile_launch_once(box: Any, tally: Tally) -> None:
    category = "serve concurrency"
    host = box.hosts[0].name
    serve = ("serve", "race", "--host", host, "--no-wait", "--skip-preflight")
    first = _fleet(box, *serve)
    out, err = first.communicate(timeout=300)
    entry = _entry(out, host)
    if entry.get("code") == "supervisor-failed":
        pytest.skip(f"supervisord cannot start here: {entry.get('error', '')[:200]}")
    assert first.returncode == 0, out + err
    stop = _fleet(box, "stop", "race", "--host", host)
    stop.communicate(timeout=120)
    for _ in range(SCALE):
        procs = [_fleet(box, *serve) for _ in range(2)]
        results = [(p, *p.communicate(timeout=300)) for p in procs]
        tally.attempt(category)
        launched = 0
        for proc, out, err in results:
            if "Traceback" in err:
                tally.bad(category, "tracebacks", err[-300:])
            entry = _entry(out, host)
            launched += bool(entry.get("changed"))
            lost = entry.get("code") in ("already-running", "host-busy")
            if proc.returncode != 0 and not (proc.returncode == 1 and lost):
                tally.bad(category, "wrong exit", f"exit {proc.returncode}: {entry}")
        servers = _servers(box)
        if launched != 1 or len(servers) != 1:
            tally.bad(category, "data loss", f"{launched} launched, {len(servers)} running")
        stop = _fleet(box, "stop", "race", "--host", host)
        stop.communicate(timeout=120)
        if _servers(box):
            tally.bad(category, "leaks", f"still running after stop: {_servers(box)}")
    # nothing but fleet's supervisord (meant to stay) is left on the host
    left = leftovers(box, keep=lambda p: "supervisord" in p)
    if left:
        tally.bad(category, "leaks", str(left))
    assert not tally.failures(category), tally.categories[category].examples

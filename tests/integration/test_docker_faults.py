"""Faults a container gives: a host paused mid-run (a stalled peer), a host restarted.

Backend-neutral: on docker a pause is ``docker pause`` and a restart ``docker restart``; on
local sshd hosts they are SIGSTOP of the host's process tree and a stop + start. Both run in
the docker stage (``-m docker``) and in the local run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from fleet.inventory import load_inventory
from fleet.sandbox.core import Sandbox
from fleet.transport import Session, fan_out

pytestmark = [pytest.mark.integration, pytest.mark.docker]

COMMAND_TIMEOUT = 8.0


@pytest.mark.sandbox(hosts=3, vllm=("0.17.0",))
def test_host_paused_mid_command_times_out_and_the_others_finish(sandbox: Sandbox) -> None:
    inv = load_inventory(sandbox.inventory_path)
    victim = sandbox.hosts[1].name
    hosts = list(inv.hosts.values())
    try:
        with Session(inv) as session:
            for h in hosts:
                session.connect(h)
            mark = sandbox.log_marks()[victim]

            def pause_when_running() -> None:  # freeze the host while its command runs
                if sandbox.wait_for_log(victim, "Starting session", since=mark):
                    sandbox.pause_host(victim)

            pauser = threading.Thread(target=pause_when_running)
            pauser.start()
            started = time.monotonic()
            outcomes = fan_out(
                session,
                hosts,
                lambda c: c.run(["sh", "-c", "sleep 2; echo done"], timeout=COMMAND_TIMEOUT).stdout,
            )
            elapsed = time.monotonic() - started
            pauser.join()
        by = {o.host: o for o in outcomes}
        assert not by[victim].ok
        assert f"command timed out after {COMMAND_TIMEOUT:.0f}s" in (by[victim].error or "")
        for h in hosts:
            if h.name != victim:
                assert by[h.name].ok and by[h.name].value == "done\n", by[h.name]
        # the stalled host cost its timeout, not more
        assert elapsed < COMMAND_TIMEOUT + 10
    finally:
        sandbox.unpause_host(victim)
    # unpaused, the host answers again
    assert sandbox.run_fleet("ping", "--host", victim).returncode == 0


@pytest.mark.sandbox(hosts=3, vllm=("0.17.0",))
def test_paused_host_fails_the_run_with_a_clear_error(sandbox: Sandbox) -> None:
    """A host that accepts TCP but never sends its SSH banner: fleet's connect timeout."""
    victim = sandbox.hosts[0].name
    sandbox.pause_host(victim)
    try:
        env = dict(sandbox.fleet_env(), FLEET_CONNECT_ATTEMPTS="1")
        started = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "fleet",
                "--inventory",
                str(sandbox.inventory_path),
                "--json",
                "ping",
                "--host",
                "all",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        elapsed = time.monotonic() - started
    finally:
        sandbox.unpause_host(victim)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts[victim]["ok"] is False and hosts[victim]["status"] == "unreachable"
    error = hosts[victim]["error"].lower()
    assert "banner" in error or "timed out" in error, error
    assert all(hosts[h.name]["ok"] for h in sandbox.hosts if h.name != victim)
    assert elapsed < 60
    assert sandbox.run_fleet("ping", "--host", victim).returncode == 0


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",))
def test_restart_host_ends_its_sessions_and_comes_back_on_the_same_port(
    sandbox: Sandbox,
) -> None:
    name, other = (h.name for h in sandbox.hosts)
    host = sandbox.host(name)
    argv = [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(sandbox.client_key_path),
        "-o",
        f"UserKnownHostsFile={sandbox.known_hosts_path}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-p",
        str(host.port),
        f"{sandbox.state.user}@{host.address}",
        "echo started; sleep 120",
    ]
    mark = sandbox.log_marks()[name]
    client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert sandbox.wait_for_log(name, "Starting session", since=mark)
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "started"
        restarted = sandbox.log_marks()[name]
        sandbox.restart_host(name)
        assert client.wait(timeout=30) != 0  # the session ended with the host
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert sandbox.running(name) and sandbox.host(name).port == host.port
    assert "Server listening on" in sandbox.sshd_log(name)[restarted:]
    env = dict(os.environ, FLEET_CONNECT_ATTEMPTS="1")
    ping = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet",
            "--inventory",
            str(sandbox.inventory_path),
            "--json",
            "ping",
            "--host",
            "all",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert ping.returncode == 0, ping.stdout + ping.stderr  # same key: still pinned
    assert {h["host_key"] for h in json.loads(ping.stdout)["hosts"].values()} == {"pinned"}
    assert sandbox.running(other)


@pytest.mark.sandbox(hosts=1, vllm=("0.17.0",))
def test_command_that_exits_before_reading_its_input_reports_its_exit_code(
    sandbox: Sandbox,
) -> None:
    """Seen first in the docker stage: `exec /missing/python -` with the facts script on
    stdin ends at once; that is the command's failure, not a lost connection."""
    inv = load_inventory(sandbox.inventory_path)
    big = b"x" * (8 << 20)  # far more than the channel's window: the host closes mid-send
    with Session(inv) as session:
        conn = session.connect(inv.hosts[sandbox.hosts[0].name])
        for _ in range(3):
            res = conn.run(["sh", "-c", "exec /nonexistent/bin/python3 -"], stdin=big, timeout=60)
            assert res.exit_code == 127, res.stderr
            assert "/nonexistent/bin/python3" in res.stderr
        assert conn.run(["echo", "still connected"], timeout=30).stdout == "still connected\n"

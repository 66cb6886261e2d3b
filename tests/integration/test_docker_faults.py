"""Faults a container gives: a host paused mid-run (a stalled peer), a host restarted.

Backend-neutral: on docker a pause is ``docker pause`` and a restart ``docker restart``; on
local sshd hosts they are SIGSTOP of the host's process tree and a stop + start. Both run in
the docker stage (``-m docker``) and in the local run.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import threading
import time
from typing import Any

import pytest
from openssh_client import ssh_argv

from fleet.inventory import load_inventory
from fleet.sandbox.core import Sandbox
from fleet.transport import Session, fan_out

pytestmark = [pytest.mark.integration, pytest.mark.docker]
ONE_ATTEMPT = {"FLEET_CONNECT_ATTEMPTS": "1"}  # a fault is reported, not retried

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
        started = time.monotonic()
        proc = sandbox.run_fleet("--json", "ping", "--host", "all", env=ONE_ATTEMPT)
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
    argv = ssh_argv(sandbox, name, "echo started; sleep 120")
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
    ping = sandbox.run_fleet("--json", "ping", "--host", "all", env=ONE_ATTEMPT)
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


def _json_lines(proc: subprocess.Popen[str]) -> queue.Queue[dict[str, Any]]:
    """The JSON objects a running ``fleet --json ...`` prints, one per line, as they come."""
    out: queue.Queue[dict[str, Any]] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(ValueError):
                out.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    return out


def _take(out: queue.Queue[dict[str, Any]], count: int, timeout: float) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        try:
            got.append(out.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            break
    return got


@pytest.mark.sandbox(hosts=1, vllm=("0.17.0",))
def test_logs_follow_resumes_after_the_host_restarts(sandbox: Sandbox) -> None:
    """``docker restart`` (local: every process of the host stopped, sshd started again)
    while ``fleet logs --follow`` streams: the follow reconnects and goes on from the byte
    after the last one it printed -- no line lost, none repeated, the numbering intact."""
    name = sandbox.hosts[0].name
    sandbox.on_host(name, 'for i in 1 2 3; do echo "line $i"; done > ~/app.log')
    argv = [*sandbox.fleet_argv(), "--json", "logs", "--host", name, "--path", "~/app.log"]
    proc = subprocess.Popen(
        [*argv, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=sandbox.fleet_env(),
    )
    try:
        out = _json_lines(proc)
        got = _take(out, 3, 60)
        sandbox.on_host(name, "echo 'line 4' >> ~/app.log")
        got += _take(out, 1, 30)
        sandbox.restart_host(name)
        # written after the restart, one of them before the follow can have reconnected
        sandbox.on_host(name, 'for i in 5 6 7; do echo "line $i"; done >> ~/app.log')
        got += _take(out, 3, 120)
        assert [(d["line"], d["text"]) for d in got] == [(i, f"line {i}") for i in range(1, 8)]
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""  # still following
        assert _take(out, 1, 3) == []  # and nothing repeated afterwards
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.sandbox(hosts=1, vllm=("0.18.0",))
def test_serve_follow_resumes_after_the_host_restarts_and_reports_the_lost_server(
    sandbox: Sandbox,
) -> None:
    """A host restarted while ``fleet serve`` follows the weight load: the follow
    reconnects, resumes at the next byte, sees that the server is gone (a restart ends
    every process) and reports a crash in the phase it had reached -- not a lost
    connection, not a wait for the stall budget."""
    name = sandbox.hosts[0].name
    log = "~/.fleet/run/kimi-eagle3/vllm.log"
    sandbox.set_sim(name, number_lines=True, load_seconds=60)
    proc = subprocess.Popen(
        [*sandbox.fleet_argv(), "--json", "serve", "kimi-eagle3", "--host", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=sandbox.fleet_env(),
    )
    try:
        deadline = time.monotonic() + 120
        probe = f"grep -c 'Loading safetensors checkpoint shards' {log} 2>/dev/null || true"
        while sandbox.on_host(name, probe).stdout.strip() in ("", "0"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.3)
        sandbox.restart_host(name)
        restarted = time.monotonic()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = json.loads(out)["hosts"][name]
    assert proc.returncode == 1 and result["outcome"] == "crashed", (result, err)
    assert result["phase"] == "weights", result
    # what the log says depends on how the host ended it (docker: SIGKILL with the
    # container; local: SIGTERM first): some diagnosis, and the crash named in the message
    assert result["diagnoses"] and result["message"].startswith("crashed in weights"), result
    assert result["follow"]["reconnects"] >= 1, result["follow"]
    # every byte of the log on the host, once: none lost or repeated across the reconnect
    size = sandbox.on_host(name, f"wc -c < {log}").stdout.strip()
    assert result["follow"]["bytes"] == int(size), (result["follow"], size)
    assert time.monotonic() - restarted < 60  # seen at once, not after the stall budget
    sandbox.set_sim(name)

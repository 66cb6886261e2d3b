"""The transport against real sshd hosts: ping, the trust flow, quoting, host down,
sshd killed mid-run, ProxyJump through a bastion, one connection per host, Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from fleet.inventory import load_inventory
from fleet.sandbox.core import Sandbox
from fleet.transport import Session, fan_out

pytestmark = pytest.mark.integration


@pytest.mark.docker
def test_ping_all(shared_sandbox: Sandbox) -> None:
    proc = shared_sandbox.run_fleet("ping", "--host", "all", "--json")
    assert proc.returncode == 0, proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert set(hosts) == {h.name for h in shared_sandbox.hosts}
    for row in hosts.values():
        assert row["ok"] is True and row["host_key"] == "pinned"
        assert row["latency_ms"] > 0


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",), pinned=False)
@pytest.mark.docker
def test_trust_flow(sandbox: Sandbox) -> None:
    first, second = (h.name for h in sandbox.hosts)
    kh = sandbox.known_hosts_path

    # unknown keys are refused, and the message names `fleet trust`
    proc = sandbox.run_fleet("ping", "--host", first)
    assert proc.returncode == 3
    assert "not pinned" in proc.stdout and f"fleet trust --host {first} --accept-new" in proc.stdout

    # trust without --accept-new only reports
    before = kh.read_text() if kh.exists() else ""
    proc = sandbox.run_fleet("trust", "--host", "all", "--json")
    assert proc.returncode == 3
    assert {r["status"] for r in json.loads(proc.stdout)["hosts"].values()} == {"unknown"}
    assert (kh.read_text() if kh.exists() else "") == before

    # --accept-new pins them, and the keys match what sshd really has (ssh-keygen -l)
    proc = sandbox.run_fleet("trust", "--host", "all", "--accept-new", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["hosts"]
    assert {r["status"] for r in rows.values()} == {"added"}
    assert sandbox.run_fleet("ping", "--host", "all").returncode == 0

    # a second trust finds them pinned and writes nothing
    pinned_text = kh.read_text()
    proc = sandbox.run_fleet("trust", "--host", "all", "--accept-new", "--json")
    assert {r["status"] for r in json.loads(proc.stdout)["hosts"].values()} == {"pinned"}
    assert kh.read_text() == pinned_text

    # a changed key is refused, and --accept-new never replaces it
    sandbox.rotate_host_key(second)
    proc = sandbox.run_fleet("ping", "--host", "all", "--json")
    assert proc.returncode == 3
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts[first]["ok"] is True
    assert hosts[second]["ok"] is False and hosts[second]["host_key"] == "changed"
    proc = sandbox.run_fleet("trust", "--host", second, "--accept-new", "--json")
    assert proc.returncode == 3
    assert json.loads(proc.stdout)["hosts"][second]["status"] == "changed"
    assert kh.read_text() == pinned_text


NASTY = ["a b", "it's", 'say "hi"', "x;touch {m}", "$(touch {m})", "`touch {m}`", "*", "|", ">x"]


def test_remote_arguments_are_inert(shared_sandbox: Sandbox, tmp_path: Path) -> None:
    host = shared_sandbox.hosts[0]
    marker = Path(host.home) / "pwned"
    args = [a.format(m=marker) for a in NASTY]
    inv = load_inventory(shared_sandbox.inventory_path)
    with Session(inv) as session:
        conn = session.connect(inv.hosts[host.name])
        res = conn.run(["printf", "%s\\n", *args], timeout=30)
        res_stdin = conn.run(["cat"], stdin="".join(a + "\n" for a in args), timeout=30)
    assert res.ok and res.stdout.splitlines() == args
    assert res_stdin.stdout.splitlines() == args
    assert not marker.exists()


def test_one_connection_per_host_per_run(shared_sandbox: Sandbox) -> None:
    inv = load_inventory(shared_sandbox.inventory_path)
    marks = shared_sandbox.log_marks()
    hosts = list(inv.hosts.values())
    with Session(inv) as session:
        for _ in range(3):
            outcomes = fan_out(session, hosts, lambda c: c.run(["hostname"]).check().stdout)
            assert all(o.ok for o in outcomes)
        assert session.opened == {h.name: 1 for h in hosts}
    for h in hosts:
        assert shared_sandbox.connection_count(h.name, since=marks[h.name]) == 1


@pytest.mark.sandbox(hosts=3, vllm=("0.17.0",))
def test_one_host_down(sandbox: Sandbox) -> None:
    down = sandbox.hosts[1].name
    sandbox.stop_host(down)
    started = time.monotonic()
    proc = sandbox.run_fleet("ping", "--host", "all", "--json")
    assert proc.returncode == 3
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts[down]["ok"] is False and hosts[down]["status"] == "unreachable"
    assert "connection refused" in hosts[down]["error"]
    assert all(hosts[h.name]["ok"] for h in sandbox.hosts if h.name != down)
    # retried with backoff, but bounded (3 attempts: 0.5 s + 1 s of waiting)
    assert time.monotonic() - started < 60
    # people get a table and one line for the host that is down
    proc = sandbox.run_fleet("ping", "--host", "all")
    assert proc.returncode == 3 and f"{down}: cannot connect" in proc.stdout


@pytest.mark.sandbox(hosts=3, vllm=("0.17.0",))
def test_sshd_killed_mid_run(sandbox: Sandbox) -> None:
    inv = load_inventory(sandbox.inventory_path)
    victim = sandbox.hosts[2].name
    hosts = list(inv.hosts.values())
    with Session(inv) as session:
        for h in hosts:
            session.connect(h)
        mark = sandbox.log_marks()[victim]

        def kill_when_running() -> None:  # kill the host while its command runs
            if sandbox.wait_for_log(victim, "Starting session", since=mark):
                sandbox.kill_host(victim)

        killer = threading.Thread(target=kill_when_running)
        killer.start()
        outcomes = fan_out(
            session, hosts, lambda c: c.run(["sh", "-c", "sleep 5; echo done"], timeout=30).stdout
        )
        killer.join()
    by = {o.host: o for o in outcomes}
    assert by[victim].status == "unreachable"
    assert "connection lost" in (by[victim].error or "")
    for h in hosts:
        if h.name != victim:
            assert by[h.name].ok and by[h.name].value == "done\n"


def _with_jump(sandbox: Sandbox, path: Path, targets: list[str], jump: str) -> Path:
    data = yaml.safe_load(sandbox.inventory_path.read_text())

    def visit(node: dict) -> None:  # type: ignore[type-arg]
        for name, hvars in (node.get("hosts") or {}).items():
            if name in targets:
                node["hosts"][name] = {**(hvars or {}), "jump": jump}
        for child in (node.get("children") or {}).values():
            visit(child)

    visit(data["all"])
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.sandbox(hosts=3, vllm=("0.17.0",))
def test_jump_host_shared_by_the_hosts_behind_it(sandbox: Sandbox, tmp_path: Path) -> None:
    bastion, *targets = (h.name for h in sandbox.hosts)
    inv = _with_jump(sandbox, tmp_path / "inventory.yaml", targets, bastion)
    marks = sandbox.log_marks()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet",
            "--inventory",
            str(inv),
            "ping",
            "--json",
            *(a for t in targets for a in ("--host", t)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # one connection to the bastion for the whole run, carrying both targets' connections
    assert sandbox.connection_count(bastion, since=marks[bastion]) == 1
    for t in targets:
        assert sandbox.connection_count(t, since=marks[t]) == 1


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",))
def test_ssh_config_proxyjump_bastion_key_must_be_pinned(sandbox: Sandbox, tmp_path: Path) -> None:
    bastion, target = sandbox.hosts
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host gw\n    HostName {bastion.address}\n    Port {bastion.port}\n"
        f"    IdentityFile {sandbox.client_key_path}\n"
        f"Host gpu\n    HostName {target.address}\n    Port {target.port}\n"
        f"    IdentityFile {sandbox.client_key_path}\n    ProxyJump gw\n"
    )
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        yaml.safe_dump(
            {"all": {"vars": {"known_hosts": str(sandbox.known_hosts_path)}, "hosts": {"gpu": {}}}}
        )
    )
    env = {**sandbox.fleet_env(), "FLEET_SSH_CONFIG": str(ssh_config)}
    cmd = [sys.executable, "-m", "fleet", "--inventory", str(inv), "ping", "--host", "gpu"]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # only the target's key pinned: the bastion hop is refused, not silently trusted
    sandbox.pin([target.name])
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 3
    assert "not pinned" in refused.stdout


def test_ctrl_c_closes_every_connection(shared_sandbox: Sandbox) -> None:
    script = textwrap.dedent(
        f"""
        import faulthandler
        import signal
        import sys
        import threading
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks on a hang
        from fleet.inventory import load_inventory
        from fleet.transport import Session, fan_out
        inv = load_inventory({str(shared_sandbox.inventory_path)!r})
        session = Session(inv)
        lock = threading.Lock()
        def say(text):  # one whole line at a time from the worker threads
            with lock:
                sys.stdout.write(text + "\\n")
                sys.stdout.flush()
        try:
            fan_out(session, list(inv.hosts.values()),
                    lambda c: (say("started"), c.run(["sleep", "60"])))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
        """
    )
    marks = shared_sandbox.log_marks()
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    seen = [proc.stdout.readline().strip() for _ in shared_sandbox.hosts]
    assert seen == ["started"] * len(shared_sandbox.hosts), seen
    # every remote `sleep 60` is running before the interrupt
    for h in shared_sandbox.hosts:
        assert shared_sandbox.wait_for_log(h.name, "Starting session", since=marks[h.name])
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)  # far less than the 60 s the commands take
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # every thread's stack, to say where it hangs
        time.sleep(2)
        proc.kill()
        stacks, _ = proc.communicate()
        pytest.fail(f"no exit 30 s after Ctrl-C; the threads were at:\n{stacks}")
    assert proc.returncode == 130 and "interrupted" in out, out
    # every host logged the disconnect (sshd writes it when the client closes)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        logs = [shared_sandbox.sshd_log(h.name)[marks[h.name] :] for h in shared_sandbox.hosts]
        if all("Disconnected from" in text or "Connection closed" in text for text in logs):
            break
        time.sleep(0.2)
    else:
        pytest.fail("not every host saw the connection closed")


def test_ctrl_c_that_lands_in_paramikos_thread_stops_a_command_in_the_main_thread(
    shared_sandbox: Sandbox,
) -> None:
    """A library caller runs a long command in its main thread; the kernel hands SIGINT to
    paramiko's transport thread (here the only one that does not block it)."""
    script = textwrap.dedent(
        f"""
        import signal, sys, time
        from fleet.inventory import load_inventory
        from fleet.transport import Session
        inv = load_inventory({str(shared_sandbox.inventory_path)!r})
        with Session(inv) as session:
            conn = session.connect(next(iter(inv.hosts.values())))  # its thread: unblocked
            signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT}})
            print("connected", flush=True)
            started = time.monotonic()
            try:
                conn.run(["sleep", "60"])
            except KeyboardInterrupt:
                print("interrupted after %.1f s" % (time.monotonic() - started), flush=True)
                sys.exit(130)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "connected"
        time.sleep(1.0)  # the command runs on the host
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)  # the command takes 60 s
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and "interrupted" in out, out


def test_ssh_config_is_honoured(shared_sandbox: Sandbox, tmp_path: Path) -> None:
    host = shared_sandbox.hosts[0]
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host gpu-alias\n    HostName {host.address}\n    Port {host.port}\n"
        f"    IdentityFile {shared_sandbox.client_key_path}\n"
    )
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {"known_hosts": str(shared_sandbox.known_hosts_path)},
                    "hosts": {"gpu-alias": {"python": host.python}},
                }
            }
        )
    )
    env = {**shared_sandbox.fleet_env(), "FLEET_SSH_CONFIG": str(ssh_config)}
    proc = subprocess.run(
        [sys.executable, "-m", "fleet", "--inventory", str(inv), "ping", "--host", "gpu-alias"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vv_logs_every_remote_command_with_host_exit_duration_and_bytes(
    shared_sandbox: Sandbox,
) -> None:
    name = shared_sandbox.hosts[0].name
    proc = shared_sandbox.run_fleet("-vv", "inspect", "--host", name)
    assert proc.returncode == 0, proc.stderr
    lines = [
        line for line in proc.stderr.splitlines() if "fleet.transport" in line and ": exit " in line
    ]
    assert lines, proc.stderr
    assert re.search(rf"{name}: exit 0 in \d+\.\d+s, \d+ bytes: sh -c 'exec ", lines[0])
    assert "Traceback" not in proc.stderr

"""``fleet serve``, ``status`` and ``stop`` end to end: real sshd hosts, the real
supervisord (installed by fleet from the wheel it pushes; on docker hosts Debian's, see
test_docker_hosts.py for the image without it), the rehearsal vLLM.

Every scenario runs the real command line against a sandbox host whose vLLM tree is the
real wheel's (patched with ``fleet patch`` where the scenario needs it) and whose
rehearsal vLLM is told which fault to play (``Sandbox.set_sim``).
"""

from __future__ import annotations

import json
import random
import secrets
import subprocess
import threading
import time
from typing import Any

import pytest

from fleet.inventory import load_inventory
from fleet.sandbox.core import Sandbox
from fleet.transport import Session

pytestmark = pytest.mark.integration
# In the docker stage too (@pytest.mark.docker): the end-to-end path, one crash, the
# server outliving the session, the secret, the follow across cut sessions. The other
# faults are the rehearsal vLLM's and the follower's logic, the same on either backend,
# and stay in the local run only (the whole run must stay under 25 minutes on 2 cores).

PROFILE = "kimi-eagle3"


def serve(box: Sandbox, *args: str, timeout: float = 300) -> tuple[int, dict[str, Any], str]:
    proc = box.run_fleet("--json", "serve", PROFILE, *args, timeout=timeout)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(
            f"no JSON (exit {proc.returncode}): {proc.stdout}\n{proc.stderr}"
        ) from None
    return proc.returncode, doc["hosts"], proc.stderr


def stop_all(box: Sandbox) -> None:
    box.run_fleet("stop", PROFILE, "--host", "all", timeout=120)


@pytest.fixture(scope="module")
def box(sandbox_factory: Any) -> Sandbox:
    """Two 0.17.0 hosts, patched once: scenarios set their fault before each serve."""
    sandbox = sandbox_factory(2, ("0.17.0",), load_seconds=3.0, name="serve")
    proc = sandbox.run_fleet("patch", "--host", "all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sandbox


@pytest.fixture()
def host(box: Sandbox) -> Any:
    name = box.hosts[0].name
    box.set_sim(name)
    yield name
    stop_all(box)
    box.set_sim(name)


@pytest.mark.docker
def test_ready_with_the_acceptance_rate(box: Sandbox, host: str) -> None:
    box.set_sim(host, acceptance_rate=0.7)
    code, hosts, _err = serve(box, "--host", host)
    r = hosts[host]
    assert code == 0 and r["outcome"] == "ready" and r["changed"], r
    assert r["endpoint"].endswith(f":{r['endpoint'].rsplit(':', 1)[1]}") and r["pid"]
    spec = r["spec_decode"]
    assert 0.55 <= spec["acceptance_rate"] <= 0.85, spec
    assert spec["mean_acceptance_length"] == pytest.approx(  # rounded to 4 places in JSON
        1 + spec["accepted_tokens"] / spec["drafts"], abs=1e-4
    )
    assert len(spec["per_position"]) == 3
    # status: ready, with the pid and the endpoint; a second serve is a no-op
    status = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
    entry = status["hosts"][host]["profiles"][PROFILE]
    assert entry["state"] == "ready" and entry["pid"] == r["pid"] and entry["uptime_s"] >= 0
    code, again, _ = serve(box, "--host", host)
    assert code == 0 and again[host]["outcome"] == "ready" and not again[host]["changed"]
    assert "already running" in again[host]["message"]


@pytest.mark.parametrize(
    ("knobs", "args", "outcome", "diagnosis"),
    [
        pytest.param({"fault": "oom"}, (), "crashed", "cuda-oom", marks=pytest.mark.docker),
        ({"fault": "nccl"}, (), "crashed", "nccl-error"),
        ({"fault": "port-in-use"}, ("--skip-preflight",), "crashed", "port-in-use"),
        (
            {"fault": "stall", "load_seconds": 30},
            ("--stall-timeout", "4"),
            "stalled",
            "load-stalled",
        ),
        ({"slow_factor": 20.0}, ("--timeout", "8"), "timeout", "load-timeout"),
        # the engine dies as it becomes ready, so the readiness checks meet it dead (with a
        # delay, a quick readiness check may finish first and rightly report ready)
        ({"fault": "crash-after-ready", "crash_after_s": 0.0}, (), "crashed", "engine-dead"),
    ],
)
def test_each_fault_ends_with_its_outcome_and_diagnosis(
    box: Sandbox,
    host: str,
    knobs: dict[str, Any],
    args: tuple[str, ...],
    outcome: str,
    diagnosis: str,
) -> None:
    box.set_sim(host, **knobs)
    started = time.monotonic()
    code, hosts, err = serve(box, "--host", host, *args)
    r = hosts[host]
    assert code == 1 and r["outcome"] == outcome, (r, err)
    assert diagnosis in [d["id"] for d in r["diagnoses"]], r["diagnoses"]
    assert time.monotonic() - started < 120


def test_a_crash_after_ready_is_a_crash_although_vllm_exits_0(box: Sandbox, host: str) -> None:
    box.set_sim(host, fault="crash-after-ready", crash_after_s=3.0)
    code, hosts, _ = serve(box, "--host", host, "--no-wait")
    assert code == 0 and hosts[host]["outcome"] == "launched"
    deadline = time.monotonic() + 90
    state = None
    while time.monotonic() < deadline:
        doc = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
        state = doc["hosts"][host]["profiles"][PROFILE]
        if state["state"] == "crashed":
            break
        time.sleep(1)
    assert state and state["state"] == "crashed", state
    exit_status = box.on_host(host, "tail -c 2000 ~/.fleet/supervisor/supervisord.log").stdout
    assert "exit status 0" in exit_status  # supervisord saw a clean exit; fleet says crashed


def test_preflight_refuses_in_seconds_what_would_crash_after_the_load(box: Sandbox) -> None:
    """An unpatched 0.17.0 host: refused before anything starts, with the fix."""
    name = box.hosts[1].name
    box.run_fleet("patch", "--host", name, "--revert")
    try:
        started = time.monotonic()
        code, hosts, _ = serve(box, "--host", name)
        r = hosts[name]
        assert code == 1 and r["outcome"] == "refused" and r["code"] == "preflight-failed"
        found = {d["id"]: d for d in r["diagnoses"]}
        assert {"eagle3-target-not-allowlisted", "eagle3-unsupported-model"} <= set(found)
        assert found["eagle3-unsupported-model"]["fix"] == f"fleet patch --host {name}"
        # the profile's requires_patch, checked with fleet patch --check's engine
        assert found["patch-not-applied"]["fix"] == f"fleet patch --host {name}"
        assert "eagle3-deepseek" in found["patch-not-applied"]["summary"]
        assert time.monotonic() - started < 30
        assert (
            box.on_host(name, "test -e ~/.fleet/run/kimi-eagle3/vllm.log", check=False).exit_code
            != 0
        )
        # without preflight: the crash vLLM really gives, at config time, diagnosed
        code, hosts, _ = serve(box, "--host", name, "--skip-preflight")
        r = hosts[name]
        assert code == 1 and r["outcome"] == "crashed", r
        assert r["diagnoses"][0]["id"] == "eagle3-target-not-allowlisted", r["diagnoses"]
    finally:
        box.run_fleet("patch", "--host", name)
        stop_all(box)


@pytest.mark.docker
def test_the_server_outlives_the_session_and_stop_is_idempotent(box: Sandbox, host: str) -> None:
    code, hosts, _ = serve(box, "--host", host, "--no-wait")
    assert code == 0
    pid = hosts[host]["pid"]
    # the fleet process and its SSH connections are gone; the server is still there
    assert box.on_host(host, ["kill", "-0", str(pid)], check=False).exit_code == 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
        if state["hosts"][host]["profiles"][PROFILE]["state"] == "ready":
            break
        time.sleep(1)
    stopped = json.loads(box.run_fleet("--json", "stop", PROFILE, "--host", host).stdout)
    assert stopped["hosts"][host]["was_running"] and stopped["hosts"][host]["changed"]
    assert stopped["hosts"][host]["gpu_memory_used_mib"] == 0  # the GPUs are free again
    again = json.loads(box.run_fleet("--json", "stop", PROFILE, "--host", host).stdout)
    assert again["hosts"][host]["already_stopped"] and not again["hosts"][host]["changed"]
    status = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
    assert status["hosts"][host]["profiles"][PROFILE]["state"] == "stopped"
    assert box.on_host(host, ["kill", "-0", str(pid)], check=False).exit_code != 0


def test_two_concurrent_serves_launch_once(box: Sandbox, host: str) -> None:
    cmd = ["--json", "serve", PROFILE, "--host", host]
    procs = [
        subprocess.Popen(
            [*box.fleet_argv(), *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=box.fleet_env(),
        )
        for _ in range(2)
    ]  # fmt: skip
    docs = [json.loads(p.communicate(timeout=300)[0])["hosts"][host] for p in procs]
    outcomes = sorted(d["outcome"] for d in docs)
    launched = [d for d in docs if d.get("changed")]
    assert len(launched) == 1, docs
    assert outcomes in (["ready", "refused"], ["ready", "ready"]), docs
    from tests.integration.serve_run import vllm_processes

    assert vllm_processes(box, host) == 1


@pytest.mark.docker
def test_the_secret_is_in_no_command_line_log_or_json(box: Sandbox, host: str) -> None:
    secret = "sk-" + secrets.token_hex(16)
    env_file = box.dir / "secret-test.env"
    env_file.write_text(f"VLLM_API_KEY={secret}\n")
    box.set_host_var(host, "secrets_env", str(env_file))
    try:
        proc = box.run_fleet("-vv", "--json", "serve", PROFILE, "--host", host, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert secret not in proc.stdout and secret not in proc.stderr
        ps = box.on_host(host, "ps -eo args").stdout
        log = box.on_host(host, "cat ~/.fleet/run/kimi-eagle3/vllm.log").stdout
        status = box.run_fleet("--json", "status", "--host", host).stdout
        assert secret not in ps and secret not in log and secret not in status
        mode = box.on_host(host, "stat -c %a ~/.fleet/run/kimi-eagle3/secrets.env").stdout.strip()
        assert mode == "600"
        # the key is really required by the server: readiness sent it
        assert json.loads(proc.stdout)["hosts"][host]["spec_decode"]["acceptance_rate"] > 0
    finally:
        box.set_host_var(host, "secrets_env", None)


@pytest.mark.docker
def test_the_follow_survives_five_cuts_without_losing_or_repeating_a_line(
    box: Sandbox, host: str
) -> None:
    from fleet.transport.follow import LogFollower, PhysicalLines
    from fleet.transport.link import HostLink

    box.set_sim(host, number_lines=True, load_seconds=25)
    code, hosts, _ = serve(box, "--host", host, "--no-wait")
    assert code == 0
    pid = hosts[host]["pid"]
    inventory = load_inventory(box.inventory_path)
    spec = inventory.hosts[host]
    cuts = 0
    done = threading.Event()

    def cutter() -> None:
        nonlocal cuts
        rng = random.Random(7)
        while not done.is_set() and cuts < 8:
            time.sleep(rng.uniform(1.0, 3.0))
            if box.cut_sessions(host):
                cuts += 1

    seqs: list[int] = []
    with Session(inventory) as session:
        follower = LogFollower(
            HostLink(session, spec), spec, "~/.fleet/run/kimi-eagle3/vllm.log", pid=pid, tick=0.5
        )
        thread = threading.Thread(target=cutter, daemon=True)
        thread.start()
        splitter = PhysicalLines()
        deadline = time.monotonic() + 120
        try:
            for chunk in follower.chunks():
                lines = splitter.feed(chunk)
                for line in lines:
                    if "[seq=" in line:
                        seqs.append(int(line.rsplit("[seq=", 1)[1].split("]", 1)[0]))
                if any("Application startup complete." in line for line in lines):
                    break
                if time.monotonic() > deadline:
                    break
        finally:
            done.set()
            follower.close()
    assert cuts >= 5 and follower.stats.reconnects >= 5, (cuts, follower.stats)
    assert seqs == list(range(1, len(seqs) + 1)), "a line was lost or repeated"
    status = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
    assert status["hosts"][host]["profiles"][PROFILE]["pid"] == pid  # never restarted

"""``fleet serve kimi-eagle3-pp2``: one model across two sandbox hosts, end to end.

Two real sshd hosts on their own loopback addresses (127.0.0.11, .12), the rehearsal vLLM
on both: with vLLM's own multi-node backend (mp) its head serves a real TCP rendezvous
that the headless worker joins; with Ray, fleet starts a real two-raylet Ray cluster on
the nodes (the real `ray` package, fleet's cached install) and the rehearsal vLLM on the
head places its ranks in a real placement group over both nodes.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import pytest

from fleet.sandbox.core import Sandbox
from tests.integration.serve_run import ServeRun, on_phase

pytestmark = pytest.mark.integration
PROFILE = "kimi-eagle3-pp2"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.11", 0))
        return int(sock.getsockname()[1])


def serve(box: Sandbox, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = box.run_fleet("--json", "serve", PROFILE, "--host", "sandbox", *args, timeout=400)
    try:
        return proc.returncode, json.loads(proc.stdout)["hosts"], proc.stderr
    except ValueError:
        raise AssertionError(proc.stdout + proc.stderr) from None


def processes(box: Sandbox, host: str, what: str) -> int:
    """Processes of this host's own environment (the sandbox hosts share this machine's
    process table): its vLLM (``vllm``) or its Ray node (``ray``)."""
    from pathlib import Path

    from fleet.sandbox.procs import parent_map

    home = box.host(host).home
    address = f"VLLM_HOST_IP={box.host(host).address}".encode()
    found = 0
    for pid in parent_map():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if what == "vllm" and f"{home}/ml-env/bin/vllm" in argv:
            found += 1
        elif what == "ray" and any(w in argv for w in ("raylet", "ray start", "gcs_server")):
            found += address in env or home in argv
    return found


def gone(box: Sandbox, *hosts: str, within: float = 40.0) -> None:
    """No vLLM and no Ray node left on any of ``hosts`` (waited for up to ``within``)."""

    def left() -> dict[str, int]:
        return {f"{h} {what}": n for h in hosts for what in ("vllm", "ray")
                if (n := processes(box, h, what))}  # fmt: skip

    deadline = time.monotonic() + within
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), left()


def state_pid(box: Sandbox, host: str, profile: str) -> int:
    text = box.on_host(host, f"cat ~/.fleet/run/{profile}/state.json").stdout
    return int(json.loads(text)["pid"])


def group_box(factory: Any, backend: str, **extra: Any) -> Sandbox:
    box: Sandbox = factory(2, ("0.17.0",), load_seconds=6, name=f"mn-{backend}",
                           distinct_addresses=True, **extra)  # fmt: skip
    master, base = free_port(), free_port()
    for host in box.hosts:
        box.set_host_var(host.name, "distributed_backend", backend)
        box.set_host_var(host.name, "master_port", str(master))
        box.set_host_var(host.name, "ray_port", str(master))
        box.set_host_var(host.name, "vllm_port_base", str(base))
    return box


def test_mp_from_a_half_patched_refusal_to_ready_then_a_dead_node_ends_the_group(
    sandbox_factory: Any,
) -> None:
    box = group_box(sandbox_factory, "mp")
    head, worker = (h.name for h in box.hosts)
    try:
        # one node unpatched: the group is refused, the fix names that node
        assert box.run_fleet("patch", "--host", head).returncode == 0
        code, hosts, err = serve(box)
        assert code == 1 and {e["outcome"] for e in hosts.values()} == {"refused"}, hosts
        found = {d["id"]: d for d in hosts[worker]["diagnoses"]}
        assert found["patch-not-applied"]["fix"] == f"fleet patch --host {worker}", found
        assert found["node-mismatch"]["fix"] == f"fleet patch --host {worker}"
        assert processes(box, head, "vllm") == 0  # nothing started
        # patched: ready across both nodes, the acceptance rate from the head
        assert box.run_fleet("patch", "--host", worker).returncode == 0
        code, hosts, err = serve(box)
        assert code == 0, ([(e.get("message"), [d["id"] for d in e.get("diagnoses") or []])
                            for e in hosts.values()], err[-2000:])  # fmt: skip
        assert hosts[head]["role"] == "head" and hosts[worker]["role"] == "worker"
        assert hosts[head]["outcome"] == hosts[worker]["outcome"] == "ready"
        assert hosts[head]["spec_decode"]["acceptance_rate"] is not None
        assert hosts[head]["endpoint"] and not hosts[worker]["endpoint"]
        log = box.on_host(worker, "cat ~/.fleet/run/kimi-eagle3-pp2/vllm.log").stdout
        assert "headless multiproc executor" in log and "rank 15 in world size 16" in log
        status = json.loads(box.run_fleet("--json", "status", "--host", "sandbox").stdout)
        nodes = {h: e["profiles"][PROFILE]["node"]["role"] for h, e in status["hosts"].items()}
        assert nodes == {head: "head", worker: "worker"}
        table = box.run_fleet("status", "--host", "sandbox").stdout
        assert "head 0 of 2" in table and "worker 1 of 2" in table, table
        # the head's vLLM log, and the worker's, each named with its node
        shown = box.run_fleet("logs", PROFILE, "--host", worker, "--tail", "5")
        assert shown.returncode == 0 and f"{worker} (worker 1 of 2)" in shown.stdout, shown
        # the head alone selected: a server across hosts stops as a whole
        stop = box.run_fleet("stop", PROFILE, "--host", head)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "stopped the rest of the group too" in stop.stdout and worker in stop.stdout
        assert "head 0 of 2" in stop.stdout and f"worker 1 of 2 (with {head})" in stop.stdout
        assert processes(box, head, "vllm") == processes(box, worker, "vllm") == 0

        # the worker's vLLM killed mid-load: crashed on both nodes, the dead node named
        killed: list[int] = []

        def kill(_event: dict[str, Any]) -> None:
            pid = state_pid(box, worker, PROFILE)
            box.on_host(worker, ["kill", "-9", str(pid)])
            killed.append(pid)

        box.set_sim(head, load_seconds=12)
        box.set_sim(worker, load_seconds=12)
        run = ServeRun(box, "sandbox", profile=PROFILE).when(on_phase("weights"), kill).start()
        code, _entry, err = run.finish()
        doc = _last_doc(run)
        assert killed, ("the load never reached the weights: nothing was killed", doc)
        assert code == 1, err[-2000:]
        assert {doc[h]["outcome"] for h in (head, worker)} == {"crashed"}, doc
        assert doc[head]["failed_node"] == worker and worker in doc[head]["message"], (
            doc[head]["message"],
            [e for e in run.events if e["event"] in ("node-exited", "crash")],
        )
        # the dead node's log is diagnosed first: its exit, then the head's symptom
        first = doc[head]["diagnoses"][0]
        assert first["values"].get("host") == worker, doc[head]["diagnoses"]
        gone(box, head, worker)
    finally:
        box.run_fleet("stop", PROFILE, "--host", "sandbox")


def test_a_node_that_never_joins_is_the_rendezvous_timeout_diagnosed(sandbox_factory: Any) -> None:
    """The worker rendered with another master port (preflight skipped): the head's
    rendezvous waits out torch's timeout (compressed) and the crash is diagnosed."""
    box = group_box(sandbox_factory, "mp")
    head, worker = (h.name for h in box.hosts)
    try:
        assert box.run_fleet("patch", "--host", "sandbox").returncode == 0
        box.set_host_var(worker, "master_port", str(free_port()))
        code, hosts, _ = serve(box)  # refused: the nodes disagree on the master port
        assert code == 1 and hosts[worker]["outcome"] == "refused"
        texts = [e["text"] for d in hosts[worker]["diagnoses"] for e in d["evidence"]]
        assert any("master_port" in t for t in texts), texts
        for name in (head, worker):
            box.set_sim(name, rendezvous_timeout_s=4)
        code, hosts, _ = serve(box, "--skip-preflight")
        assert code == 1 and hosts[head]["outcome"] == "crashed", hosts
        assert hosts[head]["diagnoses"][0]["id"] == "nccl-timeout", hosts[head]["diagnoses"]
    finally:
        box.run_fleet("stop", PROFILE, "--host", "sandbox")


def _last_doc(run: ServeRun) -> dict[str, Any]:
    text = "".join(run._rest).strip()
    return json.loads(text)["hosts"] if text else {}


@pytest.mark.skipif(os.environ.get("FLEET_SKIP_RAY") == "1", reason="FLEET_SKIP_RAY=1")
def test_ray_a_real_cluster_carries_the_group_and_a_dead_raylet_ends_it(
    sandbox_factory: Any,
) -> None:
    from fleet.errors import OperationFailed
    from fleet.sandbox.ray_env import ray_site

    try:
        ray_site()
    except OperationFailed as exc:
        pytest.skip(f"Ray cannot be installed here: {exc}")
    box = group_box(sandbox_factory, "ray", ray=True)
    head, worker = (h.name for h in box.hosts)
    try:
        assert box.run_fleet("patch", "--host", "sandbox").returncode == 0
        code, hosts, err = serve(box)
        assert code == 0, (hosts, err[-2000:])
        assert hosts[head]["spec_decode"]["acceptance_rate"] is not None
        log = box.on_host(head, "cat ~/.fleet/run/kimi-eagle3-pp2/vllm.log").stdout
        assert "Creating a new placement group" in log and "rank 15 in world size 16" in log
        ray_log = box.on_host(worker, "cat ~/.fleet/run/kimi-eagle3-pp2-ray/vllm.log").stdout
        assert "Ray runtime started" in ray_log or "ray start" in ray_log, ray_log[-1000:]
        assert processes(box, worker, "ray") >= 1
        # the worker runs only its Ray node: fleet logs reads that program's log
        shown = box.run_fleet("logs", PROFILE, "--host", worker)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert f"{worker} (worker 1 of 2, Ray node)" in shown.stdout, shown.stdout[-1500:]
        found = box.run_fleet("--json", "logs", PROFILE, "--host", "sandbox", "--diagnose")
        logs = json.loads(found.stdout)["hosts"]
        assert logs[worker]["program"] == PROFILE + "-ray" and logs[head]["program"] == PROFILE
        assert {h: e["node"]["role"] for h, e in logs.items()} == {head: "head", worker: "worker"}
        # the worker alone selected: the whole group stops, each node named
        stop = box.run_fleet("--json", "stop", PROFILE, "--host", worker)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        stopped = json.loads(stop.stdout)["hosts"]
        assert stopped[worker]["node"]["role"] == "worker" and stopped[head]["node"]["rank"] == 0
        assert stopped[head]["stopped_with_group_of"] == worker, stopped
        gone(box, head, worker)

        # the worker's Ray node killed mid-load: the group crashed, that node named
        killed: list[int] = []

        def kill(_event: dict[str, Any]) -> None:
            # the whole Ray node of the worker, as a dead host takes it: its process group
            import signal
            from pathlib import Path

            from fleet.sandbox.procs import parent_map

            mark = f"{box.host(worker).home}/ml-env/bin/ray start".encode()
            for pid in parent_map():
                try:
                    if mark in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "):
                        os.killpg(os.getpgid(pid), signal.SIGKILL)
                        killed.append(pid)
                except OSError:
                    continue

        for name in (head, worker):
            box.set_sim(name, load_seconds=14)
        run = ServeRun(box, "sandbox", profile=PROFILE).when(on_phase("weights"), kill).start()
        code, _entry, err = run.finish()
        doc = _last_doc(run)
        assert killed, ("the load never reached the weights: nothing was killed", doc)
        assert code == 1 and {doc[h]["outcome"] for h in (head, worker)} == {"crashed"}, doc
        assert doc[head]["failed_node"] == worker, doc[head]
        first = doc[head]["diagnoses"][0]
        assert first["values"].get("host") == worker, doc[head]["diagnoses"]
        gone(box, head, worker)  # the group stopped: nothing left on either node
    finally:
        box.run_fleet("stop", PROFILE, "--host", "sandbox")

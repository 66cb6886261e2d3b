"""``fleet serve`` end to end under faults: the whole command (preflight, launch, the
follow, readiness, metrics) against real sshd hosts, with the host's SSH sessions cut at
each step, its sshd frozen, fleet interrupted and run again, vLLM or its supervisor
killed mid-load.

A cut is the one a network gives: every live SSH session of the host ends (its sshd
children SIGKILLed), the listener stays. What must hold: the serve ends ``ready`` with the
acceptance rate, exit 0, vLLM started exactly once (its ``non-default args`` line counted
in the host's log), and the follow received the log's bytes in order, none lost or
repeated (the sha256 of what it got equals the host log's own prefix of that length).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from fleet.sandbox.core import Sandbox
from tests.integration.serve_run import (
    PROFILE,
    ServeRun,
    cut_while_a_script_runs,
    fresh_logs,
    launches,
    log_prefix_sha256,
    on_phase,
    on_step,
    vllm_processes,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def box(sandbox_factory: Any) -> Sandbox:
    sandbox = sandbox_factory(1, ("0.17.0",), load_seconds=8.0, name="serve-faults")
    proc = sandbox.run_fleet("patch", "--host", "all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sandbox


@pytest.fixture()
def host(box: Sandbox) -> Any:
    name = box.hosts[0].name
    box.run_fleet("stop", PROFILE, "--host", name, timeout=120)
    fresh_logs(box, name)
    box.set_sim(name)
    yield name
    box.unpause_host(name)
    box.run_fleet("stop", PROFILE, "--host", name, timeout=120)
    box.set_sim(name)


def assert_ready_once(box: Sandbox, host: str, code: int, r: dict[str, Any], err: str) -> None:
    assert code == 0 and r["outcome"] == "ready", (code, r, err[-2000:])
    spec = r["spec_decode"]
    assert spec and spec["acceptance_rate"] is not None and spec["drafts"] > 0, spec
    assert launches(box, host) == 1, "vLLM started more than once"
    follow = r["follow"]
    assert follow["sha256"] == log_prefix_sha256(box, host, follow["log_offset"]), (
        "the follow lost or repeated bytes"
    )


def cut_now(box: Sandbox, host: str) -> Any:
    return lambda _event: box.cut_sessions(host)


def cut_in_script(box: Sandbox, host: str) -> Any:
    return lambda _event: cut_while_a_script_runs(box, host)


# The step a cut lands in, how the test finds its moment, and the sim's knobs for it.
CUTS = {
    # while the on-host preflight script runs
    "preflight": (on_step("preflight"), "script", {}),
    # while the on-host launch runs (it finishes on the host: the retry finds its record)
    "launch": (on_step("launch"), "script", {}),
    "weights": (on_phase("weights"), "now", {}),
    "cuda-graphs": (on_phase("cuda-graphs"), "now", {}),
    # each HTTP answer 0.5 s late, so the cut lands inside the request
    "readiness": (on_step("readiness:models"), "now", {"http_delay_s": 0.5}),
    "metrics": (on_step("readiness:metrics", nth=2), "now", {"http_delay_s": 0.5}),
}


@pytest.mark.parametrize(
    "step",
    [
        "preflight",
        pytest.param("launch", marks=pytest.mark.docker),
        pytest.param("weights", marks=pytest.mark.docker),
        "cuda-graphs",
        "readiness",
        "metrics",
    ],
)
def test_a_cut_at_each_step_ends_ready_with_one_launch(box: Sandbox, host: str, step: str) -> None:
    match, how, knobs = CUTS[step]
    box.set_sim(host, number_lines=True, **knobs)
    action = cut_in_script(box, host) if how == "script" else cut_now(box, host)
    run = ServeRun(box, host, verbose=True).when(match, action).start()
    code, r, err = run.finish()
    assert_ready_once(box, host, code, r, err)
    assert r["link"]["reconnects"] >= 1, r["link"]
    # -v says what happened: the drop, the step it hit, the reconnect
    assert "connection lost during" in err and "reconnected after" in err, err[-3000:]
    if step in ("preflight", "launch"):
        # the cut landed inside that step's on-host script, which was asked again
        assert r["link"]["by_step"].get(step, 0) >= 1, r["link"]
    if step == "launch":
        assert r["launched"] and r["pid"], r


@pytest.mark.docker
def test_a_frozen_sshd_for_20_seconds_then_ready(box: Sandbox, host: str) -> None:
    """SIGSTOP of the host's sshd (listener and sessions; docker: the container) during
    the weights, SIGCONT 20 s later: the serve carries on to ready."""

    def freeze(_event: dict[str, Any]) -> None:
        box.pause_host(host)
        time.sleep(20)
        box.unpause_host(host)

    box.set_sim(host, number_lines=True)
    run = ServeRun(box, host).when(on_phase("weights"), freeze).start()
    code, r, err = run.finish()
    assert_ready_once(box, host, code, r, err)
    assert r["elapsed_s"] >= 20


@pytest.mark.docker
def test_ctrl_c_leaves_the_server_loading_and_a_second_serve_re_attaches(
    box: Sandbox, host: str
) -> None:
    box.set_sim(host, number_lines=True, load_seconds=12)
    run = ServeRun(box, host).when(on_phase("weights"), lambda _e: run.interrupt()).start()
    code, _doc, err = run.finish()
    assert code == 130, (code, err)
    launch = run.event("launch")
    assert launch is not None
    pid = launch["pid"]
    assert f"pid {pid}" in err and "keeps loading" in err, err
    assert f"fleet serve {PROFILE} --host {host}" in err and f"fleet stop {PROFILE}" in err
    assert vllm_processes(box, host) == 1  # still loading
    status = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
    assert status["hosts"][host]["profiles"][PROFILE]["state"] in ("loading", "starting")
    # fleet serve again: the same server followed to ready, no second launch
    again = ServeRun(box, host).start()
    code, r, err = again.finish()
    assert code == 0 and r["outcome"] == "ready" and r["attached"] and not r["launched"], r
    assert r["pid"] == pid and again.event("launch") is None
    assert any("re-attached" in n for n in r["notes"]), r["notes"]
    assert r["spec_decode"]["acceptance_rate"] is not None
    assert launches(box, host) == 1
    assert r["follow"]["sha256"] == log_prefix_sha256(box, host, r["follow"]["log_offset"])


def test_restart_still_replaces_a_loading_server(box: Sandbox, host: str) -> None:
    box.set_sim(host, load_seconds=30)
    code, doc, _ = ServeRun(box, host, ("--no-wait",)).start().finish()
    assert code == 0 and doc["launched"], doc
    code, r, _err = ServeRun(box, host, ("--restart",)).start().finish()
    assert code == 0 and r["outcome"] == "ready" and r["launched"] and not r["attached"], r
    assert r["pid"] != doc["pid"]
    assert launches(box, host) == 2  # the replaced start is in the rotated log


def test_vllm_killed_mid_load_is_a_crash_with_a_diagnosis(box: Sandbox, host: str) -> None:
    def kill(event: dict[str, Any]) -> None:
        pid = run.event("launch")["pid"]  # type: ignore[index]
        box.on_host(host, ["kill", "-9", str(pid)])

    box.set_sim(host, load_seconds=12)
    run = ServeRun(box, host).when(on_phase("weights"), kill).start()
    code, r, err = run.finish()
    assert code == 1 and r["outcome"] == "crashed" and r["phase"] == "weights", (r, err)
    ids = [d["id"] for d in r["diagnoses"]]
    assert ids and ids[0] == "process-exited", ids
    status = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
    assert status["hosts"][host]["profiles"][PROFILE]["state"] == "crashed"


@pytest.mark.docker
def test_supervisord_killed_mid_load_ends_vllm_too_and_says_so(box: Sandbox, host: str) -> None:
    def kill(_event: dict[str, Any]) -> None:
        box.on_host(host, 'kill -9 "$(cat ~/.fleet/supervisor/supervisord.pid)"')

    box.set_sim(host, load_seconds=12)
    run = ServeRun(box, host).when(on_phase("weights"), kill).start()
    code, r, err = run.finish()
    assert code == 1 and r["outcome"] == "crashed", (r, err)
    first = r["diagnoses"][0]
    assert first["id"] == "supervisor-died", r["diagnoses"]
    assert first["fix"] == f"fleet serve <profile> --host {host}" or host in (first["fix"] or "")
    deadline = time.monotonic() + 20
    while vllm_processes(box, host) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_processes(box, host) == 0, "vLLM was left running without its supervisor"
    # and the next serve starts a supervisord again
    code, r, err = ServeRun(box, host).start().finish()
    assert code == 0 and r["outcome"] == "ready", (r, err)


def test_systemd_asked_for_on_a_host_without_it_is_refused(box: Sandbox, host: str) -> None:
    box.set_host_var(host, "serve_supervisor", "systemd")
    try:
        code, r, _err = ServeRun(box, host).start().finish()
    finally:
        box.set_host_var(host, "serve_supervisor", None)
    assert code == 1 and r["outcome"] == "refused" and r["code"] == "supervisor-unavailable", r
    assert "systemd" in r["message"] and "PID 1" in r["message"], r["message"]
    assert launches(box, host) == 0

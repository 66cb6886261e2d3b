"""``fleet bench`` end to end on sandbox hosts (real sshd, the rehearsal vLLM serving with
a generation time: a decode step of 20 ms yields 1 + the accepted drafts): the load runs on
the host itself (the rehearsal vLLM has no ``vllm bench``, so fleet's own generator), both
sides get the same prompts, and the report gives both sides, the acceptance from the
counters and the speed-up; a baseline on a second host served ``--no-drafter``, and the
same host restarted without its drafter and restored.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleet.sandbox.core import Sandbox

pytestmark = pytest.mark.integration

PROFILE = "kimi-eagle3"
TIMING = {
    "step_ms": 20.0,
    "prefill_ms_per_token": 0.02,
    "acceptance_rate": 0.6,
    "load_seconds": 1.5,
}
LOAD = ("--num-prompts", "12", "--output-len", "24", "--input-len", "64", "--concurrency", "4")


def fleet(box: Sandbox, *args: str, timeout: float = 300) -> tuple[int, Any, str]:
    proc = box.run_fleet("--json", *args, timeout=timeout)
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        raise AssertionError(
            f"no JSON (exit {proc.returncode}): {proc.stdout}\n{proc.stderr}"
        ) from None


@pytest.fixture(scope="module")
def box(sandbox_factory: Any) -> Sandbox:
    sandbox = sandbox_factory(2, ("0.17.0",), load_seconds=1.5, name="bench")
    proc = sandbox.run_fleet("patch", "--host", "all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in sandbox.hosts:
        sandbox.set_sim(host.name, **TIMING)
    yield sandbox
    sandbox.run_fleet("stop", PROFILE, "--host", "all", timeout=120)


def test_with_and_without_the_drafter_on_two_hosts(box: Sandbox) -> None:
    main, other = box.hosts[0].name, box.hosts[1].name
    code, doc, err = fleet(box, "serve", PROFILE, "--host", main)
    assert code == 0, (doc, err)
    code, doc, err = fleet(box, "serve", PROFILE, "--host", other, "--no-drafter")
    assert code == 0, (doc, err)
    assert doc["hosts"][other]["spec_decode"] is None  # a plain server: no counters
    code, report, err = fleet(
        box, "bench", PROFILE, "--host", main, "--baseline-host", other, *LOAD
    )
    assert code == 0 and report["ok"], (report, err)
    spec, base = report["speculative"], report["baseline"]
    for side in (spec, base):
        assert side["tool"] == "fleet"  # the rehearsal vLLM has no `vllm bench serve`
        assert (side["completed"], side["failed"], side["total_output_tokens"]) == (12, 0, 12 * 24)
        assert side["tpot_ms"]["median"] and side["tpot_ms"]["p99"] >= side["tpot_ms"]["median"]
    assert spec["host"] == main and base["host"] == other
    counters = spec["spec_decode"]
    assert counters["acceptance_rate"] == pytest.approx(
        counters["accepted_tokens"] / counters["draft_tokens"], abs=1e-3
    )
    assert 0.5 <= counters["acceptance_rate"] <= 0.7
    assert base["spec_decode"] is None
    # 20 ms a step either way, 2.8 tokens a step with the drafter (x1.15 for the drafter's
    # share): TPOT about 2.4x lower
    assert 1.7 <= report["speedup"]["tpot_median"] <= 3.2, report["speedup"]
    assert report["speedup"]["output_throughput"] > 1.5, report["speedup"]
    assert any(w.startswith("random prompts") for w in report["warnings"])
    assert report["load"] == {"dataset": "random", "num_prompts": 12, "input_len": 64,
                              "output_len": 24, "concurrency": 4, "seed": 0}  # fmt: skip
    # the human report: both sides and the ratio
    proc = box.run_fleet("bench", PROFILE, "--host", main, "--baseline-host", other, *LOAD,
                         timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "speed-up" in proc.stdout and "TPOT median (ms)" in proc.stdout, proc.stdout
    assert f"no drafter ({other})" in proc.stdout


def test_the_same_host_restarted_without_the_drafter_and_restored(box: Sandbox) -> None:
    main = box.hosts[0].name
    code, doc, err = fleet(box, "serve", PROFILE, "--host", main)
    assert code == 0, (doc, err)
    code, status, _ = fleet(box, "status", "--host", main, PROFILE)
    before = status["hosts"][main]["profiles"][PROFILE]["pid"]
    code, report, err = fleet(box, "bench", PROFILE, "--host", main, "--baseline", "restart", *LOAD)
    assert code == 0 and report["ok"], (report, err)
    assert report["baseline_how"] == "restart"
    assert report["baseline"]["host"] == main and report["baseline"]["spec_decode"] is None
    assert report["speculative"]["spec_decode"]["drafts"] > 0
    assert report["speedup"]["tpot_median"] > 1.5
    assert [n.split(":")[0] for n in report["notes"]] == [
        "restarted without the drafter", "restarted with the drafter again"]  # fmt: skip
    # restored: ready, a new server with the drafter (the profile's fingerprint again)
    code, plan, _ = fleet(box, "rollout", PROFILE, "--host", main, "--check")
    assert plan["plan"]["hosts"][main]["action"] == "keep", plan
    code, status, _ = fleet(box, "status", "--host", main, PROFILE)
    entry = status["hosts"][main]["profiles"][PROFILE]
    assert entry["state"] == "ready" and entry["pid"] != before


def test_bench_refuses_a_host_that_does_not_serve(box: Sandbox) -> None:
    box.run_fleet("stop", PROFILE, "--host", "all", timeout=120)
    host = box.hosts[1].name
    proc = box.run_fleet("bench", PROFILE, "--host", host, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"{PROFILE} is stopped, not ready" in proc.stderr
    assert f"fleet serve {PROFILE} --host {host}" in proc.stderr, proc.stderr

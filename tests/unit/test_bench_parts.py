"""``fleet bench``'s parts without a network: the on-host load generator against the
rehearsal vLLM's real HTTP server (streamed completions, in this process), its summary
(vLLM's definitions of TTFT, TPOT, ITL), the rehearsal's generation schedule, and the
report's speed-up and warnings."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from fleet.onhost import bench as onhost_bench
from fleet.onhost.rehearsal.vllm_sim_http import (
    SimApp,
    SimMetrics,
    sim_bind,
    sim_schedule,
    sim_serve,
)
from fleet.serving.bench import BenchReport, BenchSpec, Side
from fleet.serving.readiness import SpecDecode, acceptance, parse_metrics


@pytest.mark.parametrize(
    ("max_tokens", "per_step", "steps"),
    [(1, 2.8, 1), (32, 1.0, 32), (32, 2.0, 17), (33, 2.8, 13), (100, 4.0, 26)],
)
def test_the_schedule_yields_every_token_once_in_steps_of_the_acceptance_length(
    max_tokens: int, per_step: float, steps: int
) -> None:
    timing = {"step_ms": 10.0, "prefill_ms_per_token": 1.0, "draft_cost": 0.15}
    got = sim_schedule(50, max_tokens, per_step, timing)
    assert sum(count for _wait, count in got) == max_tokens
    assert len(got) == steps
    assert got[0] == (pytest.approx(0.05 + 0.01), 1)  # prefill: 50 tokens x 1 ms + a step
    assert all(wait == pytest.approx(0.0115) for wait, _ in got[1:])  # 10 ms x 1.15


def _server(k: int, rate: float, timing: dict[str, float]) -> tuple[Any, SimApp]:
    metrics = SimMetrics([], "m", k, rate)
    app = SimApp(["m"], "/models/m", 4096, ["sk-test"], "0.17.0", metrics, lambda _l: None,
                 [], 503, timing=timing)  # fmt: skip
    server = sim_serve(sim_bind("127.0.0.1", 0), app)
    return server, app


@pytest.mark.parametrize("k", [0, 3])
def test_the_load_generator_measures_the_stream(k: int) -> None:
    timing = {"step_ms": 8.0, "prefill_ms_per_token": 0.0, "draft_cost": 0.0}
    server, app = _server(k, 0.6, timing)
    port = server.server_address[1]
    seen_running: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.01):
            seen_running.append(app.metrics.running)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        watcher.start()
        before = parse_metrics(app.metrics.exposition(), "m")
        results, duration = onhost_bench.fleet_load(
            {"port": port, "model": "m", "api_key": "sk-test", "num_prompts": 6,
             "input_len": 16, "output_len": 24, "concurrency": 3, "seed": 1}
        )  # fmt: skip
        after = parse_metrics(app.metrics.exposition(), "m")
    finally:
        stop.set()
        server.shutdown()
    summary = onhost_bench.summarize(results, duration)
    assert summary["completed"] == 6 and summary["failed"] == 0, summary["errors"]
    assert summary["total_output_tokens"] == 6 * 24
    assert max(seen_running) >= 2  # in flight at once, as vllm:num_requests_running says
    per_step = 1 + sum(app.metrics.rates)
    expected_tpot = 8.0 / per_step
    assert summary["tpot_ms"]["median"] == pytest.approx(expected_tpot, rel=0.5)
    assert summary["ttft_ms"]["median"] >= 8.0 * 0.9
    if k:
        spec = acceptance(before, after)
        assert spec.acceptance_rate == pytest.approx(0.6, abs=0.1)
        # a stream chunk per engine step: several tokens in a chunk when drafts are accepted
        assert summary["itl_ms"]["median"] == pytest.approx(8.0, rel=0.5)
    else:
        assert not after.found


def test_a_refused_request_counts_as_failed_with_its_error() -> None:
    server, _app = _server(0, 0.0, {})
    try:
        results, duration = onhost_bench.fleet_load(
            {"port": server.server_address[1], "model": "m", "api_key": "wrong",
             "num_prompts": 2, "output_len": 4, "concurrency": 2}
        )  # fmt: skip
    finally:
        server.shutdown()
    summary = onhost_bench.summarize(results, duration)
    assert summary["completed"] == 0 and summary["failed"] == 2
    assert "HTTP 401" in summary["errors"][0]


def test_random_prompts_are_the_same_for_the_same_seed() -> None:
    one = onhost_bench.prompts({"num_prompts": 3, "input_len": 40, "seed": 7})
    assert one == onhost_bench.prompts({"num_prompts": 3, "input_len": 40, "seed": 7})
    assert one != onhost_bench.prompts({"num_prompts": 3, "input_len": 40, "seed": 8})
    assert len(one) == 3 and all(len(p.split()) == 30 for p in one)
    given = onhost_bench.prompts({"num_prompts": 5, "prompts": ["a", "b"]})
    assert given == ["a", "b", "a", "b", "a"]


def test_percentiles_are_numpy_linear() -> None:
    got = onhost_bench._percentiles([float(x) for x in range(1, 101)])
    assert got == {"mean": 50.5, "median": 50.5, "p99": pytest.approx(99.01)}
    assert onhost_bench._percentiles([]) == {"mean": None, "median": None, "p99": None}


def _side(
    role: str, tpot: float, tokens_s: float, spec: SpecDecode | None, failed: int = 0
) -> Side:
    summary = {"completed": 10, "failed": failed, "output_throughput": tokens_s,
               "request_throughput": tokens_s / 100, "tpot_ms": {"median": tpot},
               "itl_ms": {"median": tpot}, "ttft_ms": {"median": 50.0},
               "e2el_ms": {"median": 50 + 99 * tpot},
               "errors": ["HTTP 500"] if failed else []}  # fmt: skip
    return Side("h", role, "fleet", summary, spec)  # type: ignore[arg-type]


def _spec(length: float) -> SpecDecode:
    return SpecDecode((length - 1) / 3, length, [], 10.0, 30.0, (length - 1) * 10)


def test_the_speedup_and_what_it_warns_about() -> None:
    report = BenchReport("p", BenchSpec(), _side("speculative", 8.0, 300.0, _spec(2.8)),
                         _side("baseline", 20.0, 120.0, None), "host")  # fmt: skip
    speed = report.speedup
    assert speed["output_throughput"] == pytest.approx(2.5)
    assert speed["tpot_median"] == pytest.approx(2.5)
    assert speed["ttft_median"] == pytest.approx(1.0)
    assert [w.split(":")[0] for w in report.warnings] == ["random prompts"]
    assert report.ok
    # a drafter that proposes nothing the target keeps, real prompts, a failing baseline
    useless = BenchReport(
        "p", BenchSpec(prompts=["hi"]), _side("speculative", 21.0, 110.0, _spec(1.02)),
        _side("baseline", 20.0, 120.0, _spec(2.0), failed=3), "host",
    )  # fmt: skip
    warnings = " | ".join(useless.warnings)
    assert "slower here (0.92x output tokens/s)" in warnings
    assert "mean acceptance length 1.02" in warnings
    assert "random prompts" not in warnings
    assert "runs a drafter too" in warnings
    assert "3 request(s) failed: HTTP 500" in warnings
    # no counters at all on the speculative side
    plain = BenchReport("p", BenchSpec(), _side("speculative", 8.0, 300.0, None))
    assert "no speculative-decoding counters" in plain.warnings[0]
    assert plain.speedup == {}


def test_a_side_with_nothing_completed_fails_the_report() -> None:
    dead = _side("speculative", 8.0, 0.0, None)
    dead.summary["completed"] = 0
    assert not BenchReport("p", BenchSpec(), dead).ok

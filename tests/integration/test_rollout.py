"""``fleet rollout`` end to end on four sandbox hosts (real sshd, the real supervisord, the
rehearsal vLLM): a new version of the profile rolled two hosts at a time while every
host's ``/health`` is polled every 0.5 s (never fewer than two ready), the plan printed by
``--check``, a canary batch, a fault on the third host that halts the rollout with the
fourth still serving the old server, and the resumed rollout.

A "new version of the profile" is the shipped profile with one value changed
(``num_speculative_tokens`` 3 -> 2), found in ``./playbooks/`` of the directory fleet runs
in (profiles are looked up there first).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.paths import playbooks_dir
from fleet.sandbox.core import Sandbox

pytestmark = pytest.mark.integration

PROFILE = "kimi-eagle3"


def fleet(box: Sandbox, cwd: Path | None, *args: str, timeout: float = 300) -> tuple[int, Any, str]:
    proc = subprocess.run(
        [*box.fleet_argv(), "--json", *args], capture_output=True, text=True, timeout=timeout,
        env=box.fleet_env(), cwd=cwd, check=False,
    )  # fmt: skip
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(
            f"no JSON (exit {proc.returncode}): {proc.stdout}\n{proc.stderr}"
        ) from None
    return proc.returncode, doc, proc.stderr


@pytest.fixture(scope="module")
def box(sandbox_factory: Any) -> Sandbox:
    """Four 0.17.0 hosts, patched, each serving the profile as shipped."""
    sandbox = sandbox_factory(4, ("0.17.0",), load_seconds=2.0, name="rollout")
    proc = sandbox.run_fleet("patch", "--host", "all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sandbox


@pytest.fixture()
def v2(tmp_path: Path) -> Path:
    """A directory whose playbooks/ holds the profile's next version."""
    text = (playbooks_dir() / f"{PROFILE}.yaml").read_text()
    assert "num_speculative_tokens: 3" in text
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / f"{PROFILE}.yaml").write_text(
        text.replace("num_speculative_tokens: 3", "num_speculative_tokens: 2")
    )
    return tmp_path


@pytest.fixture()
def serving(box: Sandbox) -> Iterator[list[str]]:
    """Every host serving version 1 of the profile, ready."""
    names = [h.name for h in box.hosts]
    for name in names:
        box.set_sim(name)
    code, doc, err = fleet(box, None, "serve", PROFILE, "--host", "all")
    assert code == 0, (doc, err)
    yield names
    box.run_fleet("stop", PROFILE, "--host", "all", timeout=120)
    for name in names:
        box.set_sim(name)


class HealthWatch:
    """Every host's ``GET /health`` every 0.5 s, straight to its vLLM port; the fewest
    hosts answering 200 at one time."""

    def __init__(self, box: Sandbox) -> None:
        self.ports = {h.name: int(h.vllm_port or 0) for h in box.hosts}
        self.fewest = len(self.ports)
        self.samples = 0
        self.timeline: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _ok(port: int) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(0.5):
            ready = sum(self._ok(p) for p in self.ports.values())
            self.samples += 1
            self.fewest = min(self.fewest, ready)
            self.timeline.append((round(time.monotonic() - started, 1), ready))

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_check_prints_the_plan_and_changes_nothing(
    box: Sandbox, serving: list[str], v2: Path
) -> None:
    code, doc, _err = fleet(box, v2, "rollout", PROFILE, "--host", "all", "--check",
                            "--canary", "1", "--batch", "2")  # fmt: skip
    assert code == 0 and doc["check"] is True
    plan = doc["plan"]
    assert plan["batches"] == [serving[:1], serving[1:3], serving[3:]]
    assert {h["action"] for h in plan["hosts"].values()} == {"roll"}
    # the same profile as running: nothing to do
    code, same, _err = fleet(box, None, "rollout", PROFILE, "--host", "all", "--check")
    assert code == 0 and same["plan"]["batches"] == []
    assert {h["action"] for h in same["plan"]["hosts"].values()} == {"keep"}
    # nothing was touched: every server still the one serve started
    pids = {h: doc["hosts"][h]["pid"] for h in serving}
    code, status, _ = fleet(box, None, "status", "--host", "all", PROFILE)
    assert {h: status["hosts"][h]["profiles"][PROFILE]["pid"] for h in serving} == pids


def test_rolls_four_hosts_two_at_a_time_never_fewer_than_two_ready(
    box: Sandbox, serving: list[str], v2: Path
) -> None:
    with HealthWatch(box) as watch:
        code, doc, err = fleet(box, v2, "rollout", PROFILE, "--host", "all", "--batch", "2")
    assert code == 0 and doc["ok"], (doc, err)
    assert doc["plan"]["batches"] == [serving[:2], serving[2:]]
    for name in serving:
        entry = doc["hosts"][name]
        assert entry["result"] == "ready" and entry["runs"] == "this profile", entry
        assert entry["steps"] == ["drain", "stop", "serve"], entry
        spec = entry["serve"]["spec_decode"]
        assert len(spec["per_position"]) == 2, spec  # the new num_speculative_tokens
    assert watch.samples >= 10, watch.timeline
    assert watch.fewest >= 2, watch.timeline  # never more than one batch down
    assert watch.fewest == 2, watch.timeline  # and a batch of two was down at some time
    # the rollout is done: run again, nothing to change
    code, again, _err = fleet(box, v2, "rollout", PROFILE, "--host", "all", "--batch", "2")
    assert code == 0 and again["ok"] and again["plan"]["batches"] == []
    assert {h["result"] for h in again["hosts"].values()} == {"kept"}


def test_a_fault_on_the_third_host_halts_with_the_fourth_still_serving_then_resumes(
    box: Sandbox, serving: list[str], v2: Path
) -> None:
    third, fourth = serving[2], serving[3]
    code, status, _ = fleet(box, None, "status", "--host", fourth, PROFILE)
    old_pid = status["hosts"][fourth]["profiles"][PROFILE]["pid"]
    box.set_sim(third, fault="oom", load_seconds=2.0)  # the next start on it crashes
    # the canary (the first host) alone, then two at a time: the third host fails in the
    # second batch, and the fourth (the third batch) is never touched
    code, doc, err = fleet(box, v2, "rollout", PROFILE, "--host", "all", "--canary", "1",
                           "--batch", "2")  # fmt: skip
    assert code == 1 and not doc["ok"], (doc, err)
    assert doc["plan"]["batches"] == [serving[:1], serving[1:3], serving[3:]]
    assert doc["halted"]["batch"] == 1 and third in doc["halted"]["reason"]
    hosts = doc["hosts"]
    assert [hosts[h]["result"] for h in serving] == ["ready", "ready", "failed", "untouched"]
    failed = hosts[third]
    assert failed["serve"]["outcome"] == "crashed"
    assert failed["serve"]["diagnoses"][0]["id"] == "cuda-oom", failed["serve"]["diagnoses"]
    assert hosts[fourth]["runs"] == "the profile as it was"
    # the fourth host still serves its old server, untouched
    code, status, _ = fleet(box, None, "status", "--host", fourth, PROFILE)
    entry = status["hosts"][fourth]["profiles"][PROFILE]
    assert entry["state"] == "ready" and entry["pid"] == old_pid
    # mend the fault and run it again: it resumes where it stopped
    box.set_sim(third)
    code, doc, err = fleet(box, v2, "rollout", PROFILE, "--host", "all", "--batch", "2")
    assert code == 0 and doc["ok"], (doc, err)
    results = {h: doc["hosts"][h]["result"] for h in serving}
    assert results == {serving[0]: "kept", serving[1]: "kept", third: "ready", fourth: "ready"}
    assert doc["plan"]["hosts"][third]["action"] == "start"  # it served nothing after the crash
    assert doc["plan"]["hosts"][fourth]["action"] == "roll"


def request_in_flight(
    box: Sandbox, host: str, *, tokens: int
) -> tuple[threading.Thread, dict[str, Any]]:
    """A completion of ``tokens`` tokens sent to the host's server from a thread (started);
    its status and answer land in the dict once it is done."""
    key = box.secrets_path.read_text().strip().split("=", 1)[1]
    port = int(box.host(host).vllm_port or 0)
    answer: dict[str, Any] = {}

    def request() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = json.dumps({"model": "kimi-k2.5", "prompt": "hello", "max_tokens": tokens})
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        conn.request("POST", "/v1/completions", body, headers)
        response = conn.getresponse()
        answer["status"] = response.status
        answer["doc"] = json.loads(response.read())
        conn.close()

    client = threading.Thread(target=request)
    client.start()
    return client, answer


def test_the_drain_waits_for_the_requests_in_flight(
    box: Sandbox, serving: list[str], v2: Path
) -> None:
    host = serving[0]
    box.set_sim(host, step_ms=100.0)  # an 80-token completion takes about 8 s
    code, doc, err = fleet(box, None, "serve", PROFILE, "--host", host, "--restart")
    assert code == 0, (doc, err)
    client, answer = request_in_flight(box, host, tokens=80)
    time.sleep(0.5)  # the request is in the engine
    code, doc, err = fleet(box, v2, "rollout", PROFILE, "--host", host)
    client.join(timeout=60)
    assert code == 0 and doc["ok"], (doc, err)
    drained = doc["hosts"][host]["drained"]
    assert drained["outcome"] == "idle" and drained["running_at_start"] == 1, drained
    assert drained["waited_s"] >= 1.0, drained
    # the request in flight finished whole before the server was stopped
    assert answer["status"] == 200 and answer["doc"]["usage"]["completion_tokens"] == 80


def test_a_stop_on_vllm_0_18_drains_the_request_in_flight(sandbox_factory: Any) -> None:
    """vLLM 0.18+ is launched with --shutdown-timeout: a stop (SIGTERM) lets the request in
    flight finish (vLLM's EngineCore logs 'Draining 1 in-flight requests')."""
    box = sandbox_factory(1, ("0.18.0",), load_seconds=1.0, name="drain18")
    host = box.hosts[0].name
    box.set_sim(host, step_ms=200.0)  # 80 tokens, ~29 steps of 2.8 tokens: about 6 s
    code, doc, err = fleet(box, None, "serve", PROFILE, "--host", host)
    assert code == 0, (doc, err)
    client, answer = request_in_flight(box, host, tokens=80)
    time.sleep(0.5)
    code, doc, err = fleet(box, None, "stop", PROFILE, "--host", host)
    client.join(timeout=60)
    assert code == 0, (doc, err)
    assert answer["status"] == 200 and answer["doc"]["usage"]["completion_tokens"] == 80
    log = box.on_host(host, ["cat", ".fleet/run/kimi-eagle3/vllm.log"]).stdout
    assert (
        "--shutdown-timeout"
        in box.on_host(host, ["cat", ".fleet/run/kimi-eagle3/launch.sh"]).stdout
    )
    assert "Draining 1 in-flight requests (timeout=30s)" in log, log[-3000:]
    box.down()

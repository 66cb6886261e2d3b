"""``fleet rollout``'s pure parts: the plan (what each host needs, in which batch), the
drain's reading of ``/metrics``, and the profile fingerprint the launch records."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import UsageError
from fleet.serving.profile import render
from fleet.serving.readiness import parse_load
from fleet.serving.rollout import Observed, plan

NOW, OLD = "f" * 64, "e" * 64

# (state, fingerprint of its server, patch set status) -> (action, patch first)
CASES = [
    ("ready", NOW, None, "keep", False),
    ("ready", NOW, "would-apply", "keep", False),  # patched at the next start; no restart now
    ("ready", OLD, None, "roll", False),
    ("ready", None, None, "roll", False),  # started by a fleet without fingerprints
    ("ready", OLD, "would-apply", "roll", True),
    ("loading", OLD, None, "roll", False),
    ("loading", NOW, None, "start", False),  # followed until ready, not started again
    ("starting", NOW, "already-applied", "start", False),
    ("crashed", NOW, None, "start", False),
    ("stopped", None, "not-needed", "start", False),
    ("stopped", None, "would-apply", "start", True),
    ("stopped", None, "conflict", "start", True),  # the patch step halts it, with its reason
]


@pytest.mark.parametrize(("state", "fingerprint", "patch", "action", "patch_first"), CASES)
def test_each_host_gets_the_action_its_server_needs(
    state: str, fingerprint: str | None, patch: str | None, action: str, patch_first: bool
) -> None:
    got = plan("p", [Observed("h1", state, fingerprint, 7, patch)], {"h1": NOW})
    step = got.of("h1")
    assert (step.action, step.patch) == (action, patch_first), step.why
    assert step.why
    assert got.batches == ([] if action == "keep" else [["h1"]])


def _hosts(n: int, state: str = "ready", fingerprint: str | None = OLD) -> list[Observed]:
    return [Observed(f"h{i}", state, fingerprint) for i in range(1, n + 1)]


def _want(n: int) -> dict[str, str]:
    return {f"h{i}": NOW for i in range(1, n + 1)}


@pytest.mark.parametrize(
    ("n", "batch", "canary", "batches"),
    [
        (4, 2, 0, [["h1", "h2"], ["h3", "h4"]]),
        (4, 2, 1, [["h1"], ["h2", "h3"], ["h4"]]),
        (5, 3, 0, [["h1", "h2", "h3"], ["h4", "h5"]]),
        (3, 1, 2, [["h1", "h2"], ["h3"]]),
        (2, 4, 5, [["h1", "h2"]]),  # a canary larger than the fleet is the whole fleet
    ],
)
def test_batches_in_inventory_order_canary_first_and_alone(
    n: int, batch: int, canary: int, batches: list[list[str]]
) -> None:
    got = plan("p", _hosts(n), _want(n), batch=batch, canary=canary)
    assert got.batches == batches
    for index, names in enumerate(batches):
        assert all(got.of(h).batch == index for h in names)


def test_hosts_already_at_the_profile_are_skipped_so_a_rerun_resumes() -> None:
    seen = _hosts(4)
    seen[0] = Observed("h1", "ready", NOW)
    seen[1] = Observed("h2", "ready", NOW)
    got = plan("p", seen, _want(4), batch=2)
    assert got.batches == [["h3", "h4"]] and got.changes == 2
    assert got.of("h1").action == "keep" and got.of("h1").batch is None


@pytest.mark.parametrize(("batch", "canary"), [(0, 0), (1, -1)])
def test_bad_sizes_are_usage_errors(batch: int, canary: int) -> None:
    with pytest.raises(UsageError):
        plan("p", _hosts(1), _want(1), batch=batch, canary=canary)


def test_the_drain_reads_running_and_waiting_requests_over_every_engine() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0\n'
    )
    load = parse_load(text)
    assert (load.running, load.waiting, load.found, load.idle) == (3.0, 4.0, True, False)
    idle = parse_load(text.replace(" 2.0", " 0.0").replace(" 1.0", " 0.0").replace(" 4.0", " 0"))
    assert idle.idle and idle.found
    assert not parse_load("").found


BASE = {
    "name": "p",
    "model": "/models/T",
    "served_model_name": "t",
    "tensor_parallel_size": 8,
    "speculative": {"method": "eagle3", "model": "/models/D", "num_speculative_tokens": 3},
    "secrets": {"env_file": "/etc/fleet/p.env", "required": ["VLLM_API_KEY"]},
}


def test_the_fingerprint_follows_the_served_values_not_the_secrets(tmp_path: Path) -> None:
    one = render(BASE, {})
    assert one.fingerprint() == render(dict(BASE), {}).fingerprint()  # stable
    spec = dict(BASE["speculative"], num_speculative_tokens=2)  # type: ignore[arg-type]
    assert render({**BASE, "speculative": spec}, {}).fingerprint() != one.fingerprint()
    assert render({**BASE, "max_model_len": 4096}, {}).fingerprint() != one.fingerprint()
    assert one.without_drafter().fingerprint() != one.fingerprint()
    # secrets are by reference: the env file's content is never read for it
    secrets = tmp_path / "p.env"
    secrets.write_text("VLLM_API_KEY=one\n")
    first = render({**BASE, "secrets": {"env_file": str(secrets)}}, {}).fingerprint()
    secrets.write_text("VLLM_API_KEY=two\n")
    assert render({**BASE, "secrets": {"env_file": str(secrets)}}, {}).fingerprint() == first


def test_a_profile_without_a_drafter_serves_without_speculative_decoding() -> None:
    plain = render({k: v for k, v in BASE.items() if k != "speculative"}, {})
    assert plain.speculative is None and plain.speculative_json() is None
    assert "--speculative-config" not in plain.vllm_args()
    assert "--speculative-config" in render(BASE, {}).vllm_args()

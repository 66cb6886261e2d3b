"""Every path the rehearsal vLLM can take, run for real and diagnosed by fleet.diagnosis.

- unpatched 0.10.2-0.17 trees fail at config time (the APIServer's ValidationError, no
  EngineCore, exit 1); the same trees patched by fleet's engine start; 0.18+ start as
  installed; every successful start is diagnosed clean;
- each fatal path is diagnosed as its taxonomy id, with vLLM's exit code, at the point
  vLLM fails (after the weights for the EAGLE-3 interface; at config time for the
  allowlist, the parallel layout and the drafter's architecture; in init_device for GPU
  memory and NCCL; in the profile run for the drafter's shapes; after ready for an engine
  death, which exits 0 as vLLM does).
"""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sim_harness import Sim, make_home, patched_tree, run_sim, serve_args, target_for

from fleet.diagnosis import diagnose
from fleet.sandbox.local import free_port
from fleet.sandbox.vllm_source import vllm_tree
from tests.versions import PATCHED, UPSTREAM

PRE_18 = PATCHED  # the releases tested that need the patch set (tests/versions.py)
FROM_18 = UPSTREAM  # ...and those that serve EAGLE-3 on DeepSeek/Kimi unpatched
ALLOWLIST = ["config/speculative.py", "config/__init__.py"]


@pytest.fixture(scope="module")
def trees_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sim-trees")


def ids(run: Any) -> list[str]:
    return [d.id for d in diagnose(run.diagnose_lines())]


@pytest.mark.parametrize("version", PRE_18)
def test_unpatched_tree_fails_at_config_time(version: str, tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", load_seconds=0.5)
    run = run_sim(home, vllm_tree(version), serve_args(home, version))
    assert run.returncode == 1 and not run.ready
    found = ids(run)
    assert found[0] == "eagle3-target-not-allowlisted", (found, run.text[-1500:])
    # in the APIServer, before any engine process: no EngineCore or worker line at all
    assert "EngineCore" not in run.text and "Worker" not in run.text
    assert "validation error for SpeculativeConfig" in run.text
    assert run.text.rstrip().splitlines()[-1].endswith("/v/value_error")


@pytest.mark.parametrize("version", PRE_18)
def test_patched_tree_starts_and_is_diagnosed_clean(
    version: str, trees_root: Path, tmp_path: Path
) -> None:
    home = make_home(tmp_path / "home", load_seconds=0.5)
    run = run_sim(home, patched_tree(version, trees_root), serve_args(home, version))
    assert run.ready and run.returncode == 0, run.text[-2000:]
    assert ids(run) == []


@pytest.mark.parametrize("version", FROM_18)
def test_upstream_tree_starts_unpatched_and_is_diagnosed_clean(
    version: str, tmp_path: Path
) -> None:
    home = make_home(tmp_path / "home", load_seconds=0.5)
    run = run_sim(home, vllm_tree(version), serve_args(home, version))
    assert run.ready and run.returncode == 0, run.text[-2000:]
    assert ids(run) == []


def _custom_drafter(home: Path, name: str, **changes: Any) -> str:
    base = json.loads((home / "models" / "Kimi-K25-eagle3" / "config.json").read_text())
    base.update(changes)
    path = home / "models" / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(base))
    (path / "model.safetensors").write_bytes(
        (home / "models/Kimi-K25-eagle3/model.safetensors").read_bytes()
    )
    return name


# name: (version, tree ("wheel" | "patched" | "allowlist"), home/args setup, exit, id);
# each release here is chosen for its scenario (a release outside tests/versions.py TESTED
# says why), most are the last one patched
FATAL: dict[str, tuple[str, str, dict[str, Any], int, str]] = {
    "eagle3-runtime": (
        "0.17.0",
        "allowlist",
        {"target": "Kimi-K2-Instruct"},
        1,
        "eagle3-unsupported-model",
    ),
    "eagle3-runtime-0.13": ("0.13.0", "allowlist", {}, 1, "eagle3-unsupported-model"),
    "kimi-image-token": ("0.16.0", "allowlist", {}, 1, "eagle3-unsupported-model"),
    "oom": ("0.17.0", "patched", {"knobs": {"fault": "oom"}}, 1, "cuda-oom"),
    "nccl": ("0.17.0", "patched", {"knobs": {"fault": "nccl"}}, 1, "nccl-error"),
    "port-knob": ("0.17.0", "patched", {"knobs": {"fault": "port-in-use"}}, 1, "port-in-use"),
    "tp-16": (
        "0.17.0",
        "patched",
        {"extra": ["--tensor-parallel-size", "16"]},
        1,
        "tp-size-invalid",
    ),
    "mismatched-drafter": (
        "0.17.0",
        "patched",
        {"drafter": "mismatched-eagle3"},
        1,
        "drafter-incompatible",
    ),
    "aux-layer-out-of-range": (
        "0.18.0",
        "wheel",
        {"drafter_changes": {"eagle_aux_hidden_state_layer_ids": [2, 30, 61]}},
        1,
        "drafter-incompatible",
    ),
    "mla-drafter-pre-0.18": (
        "0.17.0",
        "patched",
        {"drafter_changes": {"architectures": ["Eagle3DeepseekV2ForCausalLM"]}},
        1,
        # the registry error names an EAGLE drafter's architecture: the drafter does not fit
        "drafter-incompatible",
    ),
    "kimi_k2-drafter-pre-0.18": (
        "0.17.0",
        "patched",
        {"drafter_changes": {"model_type": "kimi_k2"}},
        1,
        "architecture-unsupported",
    ),
    "no-trust-remote-code": (
        "0.14.0",  # the <=0.14 log family's last release (no other scenario starts it)
        "patched",
        {"no_trust": True},
        1,
        "trust-remote-code-required",
    ),
    "k25-before-0.15": (
        "0.14.0",  # the last release before kimi_k25.py (KIMI_K25_SINCE): the boundary
        "patched",
        {"target": "Kimi-K2.5"},
        1,
        "architecture-unsupported",
    ),
    "spec-unknown-key": (
        "0.17.0",
        "patched",
        {"spec_extra": {"bogus": 1}},
        1,
        "spec-config-invalid",
    ),
    "spec-bad-json": (
        "0.17.0",
        "patched",
        {"extra": ["--speculative-config", "{method:eagle3"]},
        2,
        "spec-config-invalid",
    ),
    "max-model-len": (
        "0.17.0",
        "patched",
        {"extra": ["--max-model-len", "1M"]},
        1,
        "max-model-len-too-large",
    ),
    "gpu-busy": (
        "0.17.0",
        "patched",
        {"gpu_state": {"memory_used_mib": [60000] * 8}},
        1,
        "gpu-memory-utilization-too-high",
    ),
    "kv-too-small": (
        "0.17.0",
        "patched",
        {"extra": ["--gpu-memory-utilization", "0.45"]},
        1,
        "kv-cache-too-small",
    ),
    "kv-no-memory": (
        "0.17.0",
        "patched",
        {"extra": ["--gpu-memory-utilization", "0.4"]},
        1,
        "kv-cache-no-memory",
    ),
}


def _setup(name: str, trees_root: Path, tmp_path: Path) -> tuple[Path, Path, list[str]]:
    version, tree_kind, setup, _code, _id = FATAL[name]
    home = make_home(
        tmp_path / "home",
        load_seconds=0.5,
        knobs=setup.get("knobs"),
        gpu_state=setup.get("gpu_state"),
    )
    if tree_kind == "wheel":
        tree = vllm_tree(version)
    elif tree_kind == "patched":
        tree = patched_tree(version, trees_root)
    else:  # only the config-time allowlist: the runtime checks stay as installed
        tree = patched_tree(version, trees_root, only=ALLOWLIST)
    drafter = setup.get("drafter", "Kimi-K25-eagle3")
    if "drafter_changes" in setup:
        drafter = _custom_drafter(home, "custom-eagle3", **setup["drafter_changes"])
    spec = None
    if "spec_extra" in setup:
        spec = {
            "method": "eagle3",
            "model": str(home / "models" / drafter),
            "num_speculative_tokens": 3,
            **setup["spec_extra"],
        }
    args = serve_args(
        home,
        version,
        target=setup.get("target", target_for(version)),
        drafter=drafter,
        extra=setup.get("extra", ()),
        spec=spec,
    )
    if setup.get("no_trust"):
        args.remove("--trust-remote-code")
    return home, tree, args


@pytest.mark.parametrize("name", sorted(FATAL))
def test_fatal_path_exit_code_and_diagnosis(name: str, trees_root: Path, tmp_path: Path) -> None:
    code, expected = FATAL[name][3], FATAL[name][4]
    home, tree, args = _setup(name, trees_root, tmp_path)
    run = run_sim(home, tree, args)
    assert not run.ready and run.returncode == code, run.text[-2500:]
    found = ids(run)
    assert found and found[0] == expected, (found, run.text[-2500:])
    # nothing is left behind: the server's GPU memory is released, its pid file removed
    state = home / ".fleet-sandbox" / "gpu-state.json"
    if state.exists():
        doc = json.loads(state.read_text())
        mine = [p for p in doc.get("processes") or [] if p.get("owner") is not None]
        assert mine == []
    assert list((home / ".fleet-sandbox" / "run").iterdir()) == []


def test_eagle3_crash_comes_after_the_weights_in_every_worker(
    trees_root: Path, tmp_path: Path
) -> None:
    home, tree, args = _setup("eagle3-runtime", trees_root, tmp_path)
    run = run_sim(home, tree, args)
    lines = run.physical_lines()
    crash = [
        i
        for i, line in enumerate(lines)
        if line.endswith(
            "RuntimeError: Model does not support EAGLE3 interface but "
            "aux_hidden_state_outputs was requested"
        )
    ]
    assert len(crash) == 8  # one per worker, TP0..TP7
    assert [f"(Worker_TP{k} pid=" in lines[i] for k, i in enumerate(crash)] == [True] * 8
    loaded = max(i for i, line in enumerate(lines) if "Loading weights took" in line)
    assert loaded < crash[0]
    wrappers = [line for line in lines if "EngineCore failed to start." in line]
    assert wrappers and all("(EngineCore_DP0 pid=" in w for w in wrappers)
    assert any(
        line.startswith("(EngineCore_DP0 pid=") and line.endswith("Process EngineCore_DP0:")
        for line in lines
    )
    assert lines[-1].endswith(
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}"
    )
    # the worker's multi-line record: every physical line carries its header, all but
    # the last end in \r (NewLineFormatter)
    record = lines[crash[0] - 3 : crash[0] + 1]
    assert all("ERROR" in line and "[multiproc_executor.py:" in line for line in record)
    assert all(line.endswith("\r") for line in record[:-1])


def test_a_taken_port_fails_the_bind_before_the_load(trees_root: Path, tmp_path: Path) -> None:
    """A port held by a plain listener (no SO_REUSEPORT): the bind in setup_server fails."""
    home = make_home(tmp_path / "home", load_seconds=0.5)
    port = free_port("127.0.0.1")
    holder = socket.socket()
    holder.bind(("", port))
    holder.listen(1)
    try:
        run = run_sim(
            home, patched_tree("0.17.0", trees_root), serve_args(home, "0.17.0", port=port)
        )
    finally:
        holder.close()
    assert run.returncode == 1 and ids(run)[0] == "port-in-use"
    assert "Resolved architecture" not in run.text  # before the config: right after the banner
    assert run.text.rstrip().endswith("OSError: [Errno 98] Address already in use")


def test_two_simulated_servers_share_a_port_as_vllm_does(trees_root: Path, tmp_path: Path) -> None:
    """vLLM binds with SO_REUSEADDR + SO_REUSEPORT: a second server binds the same port
    (docs/research/vllm-serve.md §0.5); the second then fails on the GPUs the first holds."""
    tree = patched_tree("0.17.0", trees_root)
    port = free_port("127.0.0.1")
    home = make_home(tmp_path / "home", load_seconds=0.5)
    first = Sim(home, tree, serve_args(home, "0.17.0", port=port))
    try:
        assert first.wait_for(b"Application startup complete.", 60)
        second_home = tmp_path / "home"  # the same host: same GPUs
        second = run_sim(
            second_home, tree, serve_args(second_home, "0.17.0", port=port), timeout=60
        )
        assert second.returncode == 1
        assert "Address already in use" not in second.text
        assert ids(second)[0] == "gpu-memory-utilization-too-high"
    finally:
        first.signal(signal.SIGTERM)
        assert first.wait(30) == 0


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.parametrize("crash", ["engine", "worker"])
def test_engine_death_after_ready_503_then_a_clean_exit_0(
    crash: str, trees_root: Path, tmp_path: Path
) -> None:
    home = make_home(
        tmp_path / "home",
        load_seconds=0.5,
        knobs={
            "fault": "crash-after-ready",
            "crash": crash,
            "crash_after_s": 0.5,
            "watchdog_s": 2.0,
        },
    )
    sim = Sim(home, patched_tree("0.17.0", trees_root), serve_args(home, "0.17.0"))
    try:
        assert sim.wait_for(b"Application startup complete.", 60)
        base = f"http://127.0.0.1:{sim.port}"
        assert _get(base + "/health") == 200
        # the client's line: from here requests see a dead engine
        assert sim.wait_for(b"Engine core proc EngineCore_DP0 died unexpectedly", 30)
        assert _get(base + "/health") == 503
        code = sim.wait(30)
    finally:
        if sim.proc.poll() is None:
            sim.kill()
    run = sim.result(True)
    assert code == 0  # vllm#48966: Restart=on-failure never sees it
    assert run.text.rstrip().endswith(f"INFO:     Finished server process [{sim.proc.pid}]")
    assert ids(run)[0] == ("engine-dead" if crash == "engine" else "worker-died")


def test_sigterm_during_the_load_is_keyboardinterrupt_terminated(
    trees_root: Path, tmp_path: Path
) -> None:
    home = make_home(tmp_path / "home", load_seconds=6.0)
    sim = Sim(home, patched_tree("0.17.0", trees_root), serve_args(home, "0.17.0"))
    try:
        assert sim.wait_for(b"Loading safetensors checkpoint shards", 60)
        sim.signal(signal.SIGTERM)
        code = sim.wait(30)
    finally:
        if sim.proc.poll() is None:
            sim.kill()
    run = sim.result(False)
    assert code == -signal.SIGINT  # dies by SIGINT: a shell reports 130
    assert run.text.rstrip().endswith("KeyboardInterrupt: terminated")
    assert 'raise KeyboardInterrupt("terminated")' in run.text
    assert ids(run) == []  # benign by itself; fleet's own marker tells the story


def test_stall_stops_the_output_and_keeps_the_process(trees_root: Path, tmp_path: Path) -> None:
    home = make_home(
        tmp_path / "home", load_seconds=1.0, knobs={"fault": "stall", "fault_at_shard": 10}
    )
    sim = Sim(home, patched_tree("0.17.0", trees_root), serve_args(home, "0.17.0"))
    try:
        assert sim.wait_for(b"| 9/64 [", 60)
        time.sleep(0.5)
        size = len(sim.output())
        time.sleep(1.5)
        assert sim.proc.poll() is None and len(sim.output()) == size
        assert b"| 10/64 [" not in sim.output()
        sim.signal(signal.SIGTERM)
        assert sim.wait(30) == -signal.SIGINT
    finally:
        if sim.proc.poll() is None:
            sim.kill()


@pytest.mark.parametrize("then", ["resume", "kill"])
def test_truncated_line(then: str, trees_root: Path, tmp_path: Path) -> None:
    knobs = {
        "fault": "truncated-line",
        "fault_at_shard": 5,
        "truncate_pause_s": 1.0,
        "truncate_then": then,
    }
    home = make_home(tmp_path / "home", load_seconds=1.0, knobs=knobs)
    sim = Sim(home, patched_tree("0.17.0", trees_root), serve_args(home, "0.17.0"))
    try:
        assert sim.wait_for(b"| 4/64 [", 60)
        time.sleep(0.5)
        partial = sim.output()
        assert partial.endswith(b"\rLoading safetensors checkpoint shards: ")  # no "\n" yet
        code = sim.wait(60) if then == "kill" else None
        if then == "resume":
            assert sim.wait_for(b"Application startup complete.", 60)
            sim.signal(signal.SIGTERM)
            code = sim.wait(30)
    finally:
        if sim.proc.poll() is None:
            sim.kill()
    text = sim.output()
    if then == "kill":
        assert code == -signal.SIGKILL and text == partial
    else:
        assert code == 0
        assert b"\rLoading safetensors checkpoint shards:   8% Completed | 5/64 [" in text
        assert b"\rLoading safetensors checkpoint shards: \r" not in text


def test_unknown_flag_is_refused_as_argparse_does(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    run = run_sim(home, vllm_tree("0.17.0"), [*serve_args(home, "0.17.0"), "--no-such-flag", "1"])
    assert run.returncode == 2
    assert run.text == (
        "usage: vllm serve [model_tag] [options]\n"
        "vllm serve: error: unrecognized arguments: --no-such-flag 1\n"
    )


def test_flags_are_read_from_the_installed_parser(tmp_path: Path) -> None:
    """`--swap-space` is gone in 0.25, `--enable-per-request-metrics` new there
    (engine/arg_utils.py): each version takes its own and refuses the other's."""
    home = make_home(tmp_path / "home", load_seconds=0.3)
    for version, good, bad in (
        ("0.17.0", ["--swap-space", "4"], "--enable-per-request-metrics"),
        ("0.25.0", ["--enable-per-request-metrics"], "--swap-space"),
    ):
        args = serve_args(home, version, drafter=None)  # no EAGLE-3: starts unpatched
        refused = run_sim(home, vllm_tree(version), [*args, bad])
        assert refused.returncode == 2 and f"unrecognized arguments: {bad}" in refused.text
        taken = run_sim(home, vllm_tree(version), [*args, *good])
        assert taken.ready and taken.returncode == 0, taken.text[-1500:]

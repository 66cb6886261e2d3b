"""A server across hosts against the real vLLM trees: what each release offers for a
multi-node start (the on-host ``_vllm_offers``, read from the installed source), and the
rehearsal vLLM started as a head and a headless worker, one release per log family, each
printing its own release's lines (the headless line, the rank lines, the world-size
refusal: 0.11.1-0.12 and 0.13+ word it differently, before 0.11.1 vLLM picks Ray itself).
"""

from __future__ import annotations

import importlib.util
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from fleet.diagnosis import diagnose
from fleet.inventory import HostSpec
from fleet.onhost.families import log_family
from fleet.onhost.serve import _vllm_offers
from fleet.sandbox.local import free_port
from fleet.sandbox.vllm_source import vllm_tree
from fleet.serving.multinode import MP_SINCE, Offers, judge_group, split_groups
from fleet.serving.observed import PreflightAnswer
from fleet.serving.profile import for_host
from tests.unit.sim_harness import Sim, make_home, run_sim, serve_args
from tests.versions import FAMILY_REPRESENTATIVES, MULTINODE_FAMILIES, MULTINODE_OFFERS

# what each release's source defines (engine/arg_utils.py, envs.py, the serve CLI)
OFFERS: dict[str, dict[str, bool]] = {
    "0.11.0": {"nnodes": False, "distributed_timeout_seconds": False,
               "engine_ready_timeout": False, "shutdown_timeout": False},
    "0.11.1": {"nnodes": True, "distributed_timeout_seconds": False,
               "engine_ready_timeout": False, "shutdown_timeout": False},
    "0.13.0": {"nnodes": True, "distributed_timeout_seconds": False,
               "engine_ready_timeout": False, "shutdown_timeout": False},
    "0.14.0": {"nnodes": True, "distributed_timeout_seconds": False,
               "engine_ready_timeout": True, "shutdown_timeout": False},
    "0.17.0": {"nnodes": True, "distributed_timeout_seconds": False,
               "engine_ready_timeout": True, "shutdown_timeout": False},
    "0.18.0": {"nnodes": True, "distributed_timeout_seconds": True,
               "engine_ready_timeout": True, "shutdown_timeout": True},
}  # fmt: skip
HOSTS = [HostSpec(name=f"h{i}", address=f"10.0.0.{i}", python="/env/bin/python",
                  vars={"models_dir": "/m"}) for i in (1, 2)]  # fmt: skip
GPU_CSV = "".join(f"{i}, NVIDIA H200, 143771, 0, 570.1\n" for i in range(8))


def test_the_table_covers_the_versions_under_test() -> None:
    assert set(OFFERS) == set(MULTINODE_OFFERS)
    assert [log_family(v) for v in MULTINODE_FAMILIES] == [
        log_family(v) for v in FAMILY_REPRESENTATIVES
    ]
    assert all(tuple(map(int, v.split("."))) >= MP_SINCE for v in MULTINODE_FAMILIES)


@pytest.mark.parametrize("version", MULTINODE_OFFERS)
def test_what_each_release_offers_is_read_from_its_source(version: str) -> None:
    offers = _vllm_offers(str(vllm_tree(version) / "vllm"))
    assert offers == {"headless": True, **OFFERS[version]}, offers
    answer = PreflightAnswer.model_validate({
        "home": "/root",
        "vllm": {"version": version, "offers": offers},
        "gpus": {"exit_code": 0, "stdout": GPU_CSV, "stderr": ""},
        "node": {"address_local": True, "ports": {}, "peers": {}},
    })  # fmt: skip
    seen = Offers.of(answer)
    assert seen.multinode_mp == (tuple(map(int, version.split("."))) >= MP_SINCE)
    # the group preflight: mp refused where vLLM has no multi-node mode, a note for each
    # timeout this release cannot take from the load budget
    profile = for_host("kimi-eagle3-pp2", HOSTS[0])
    group = split_groups(HOSTS, 2)[0]
    check = judge_group(profile, group, {"h1": answer, "h2": answer})
    refused = [d.id for d in check.diagnoses.get("h1", [])]
    assert ("multinode-unsupported" in refused) == (not seen.multinode_mp), refused
    notes = " ".join(check.notes)
    assert ("--distributed-timeout-seconds" in notes) == (not seen.distributed_timeout)
    assert ("VLLM_ENGINE_READY_TIMEOUT_S" in notes) == (not seen.engine_ready_timeout)


def _node_args(home: Path, version: str, rank: int, master: int) -> list[str]:
    args = [*serve_args(home, version, drafter=None), "--pipeline-parallel-size", "2",
            "--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", str(rank),
            "--master-addr", "127.0.0.1", "--master-port", str(master)]  # fmt: skip
    if rank:
        args.append("--headless")
    if OFFERS[version]["distributed_timeout_seconds"]:  # 0.18+: the load budget
        args += ["--distributed-timeout-seconds", "600"]
    return args


def _source(version: str, rel: str) -> str:
    return (vllm_tree(version) / "vllm" / rel).read_text(encoding="utf-8")


@pytest.mark.parametrize("version", MULTINODE_FAMILIES)
def test_a_head_and_a_headless_worker_start_together(version: str, tmp_path: Path) -> None:
    """TP8 x PP2 over two rehearsal nodes: the worker says it runs headless, each node
    prints its own global ranks in this release's words, the head serves."""
    master = free_port("127.0.0.1")
    sims: dict[str, Sim] = {}
    for rank in (1, 0):  # the worker first, as fleet starts them
        home = make_home(tmp_path / f"node{rank}", load_seconds=1.0)
        sims["worker" if rank else "head"] = Sim(
            home, vllm_tree(version), _node_args(home, version, rank, master),
            env={"VLLM_HOST_IP": "127.0.0.1"},
        )  # fmt: skip
    try:
        assert sims["head"].wait_for(b"Application startup complete.", 90), sims["head"].output()[
            -2000:
        ]
        text = {k: s.output().decode("utf-8", "replace") for k, s in sims.items()}
    finally:
        sims["head"].signal(signal.SIGTERM)
        for sim in sims.values():
            try:
                sim.wait(30)
            except Exception:
                sim.kill()
    headless = f"Launching vLLM (v{version}) headless multiproc executor"
    assert headless in text["worker"] and headless not in text["head"]
    # the rank line as this release formats it (0.11.1 has no PCP rank, 0.17+ does)
    pcp = '"DP rank %s, PP rank %s, PCP rank %s, "' in _source(
        version, "distributed/parallel_state.py"
    )
    for node, ranks in (("head", range(8)), ("worker", range(8, 16))):
        for r in ranks:
            found = re.search(rf"rank {r} in world size 16 is assigned as DP rank 0, "
                              rf"PP rank {r // 8}, (?P<pcp>PCP rank 0, )?TP rank {r % 8}",
                              text[node])  # fmt: skip
            assert found, (node, r, text[node][-1500:])
            assert bool(found.group("pcp")) == pcp, found.group(0)
    assert diagnose(text["head"].splitlines()) == []


@pytest.mark.parametrize(
    ("version", "expected", "rule"),
    [
        # 0.11.1-0.12: the world size beyond one node's GPUs without a backend
        ("0.11.1", "Tensor parallel size (16) cannot be larger than the number of available "
                   "GPUs (8).", "tp-size-invalid"),
        # 0.13+: reworded, naming the backends
        ("0.13.0", "World size (16) is larger than the number of available GPUs (8) in this "
                   "node. If this is intentional", "tp-size-invalid"),
        ("0.18.0", "World size (16) is larger than the number of available GPUs (8) in this "
                   "node. If this is intentional", "tp-size-invalid"),
        # before 0.11.1 vLLM picks Ray by itself, and without Ray says it needs it
        ("0.11.0", "Unable to load Ray: No module named 'ray'. Ray is required for "
                   "multi-node inference", "install-abi-mismatch"),
    ],
)  # fmt: skip
def test_a_world_beyond_one_node_is_refused_in_each_release_s_words(
    version: str, expected: str, rule: str, tmp_path: Path
) -> None:
    if version == "0.11.0" and importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is importable here: vLLM 0.11.0 would pick it by itself")
    home = make_home(tmp_path / "home", load_seconds=0.3)
    args: list[Any] = serve_args(home, version, drafter=None)
    args[args.index("--tensor-parallel-size") + 1] = "16"
    run = run_sim(home, vllm_tree(version), args)
    assert run.returncode == 1 and expected in run.text, run.text[-1500:]
    assert [d.id for d in diagnose(run.diagnose_lines())][:1] == [rule]


def test_before_0_11_1_vllm_s_multi_node_flags_are_refused(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", load_seconds=0.3)
    args = [*serve_args(home, "0.11.0", drafter=None), "--nnodes", "2", "--headless"]
    run = run_sim(home, vllm_tree("0.11.0"), args)
    assert run.returncode == 2 and "unrecognized arguments: --nnodes 2" in run.text, run.text
    assert [d.id for d in diagnose(run.diagnose_lines())] == ["cli-args-invalid"]

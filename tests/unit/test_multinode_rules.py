"""A server across hosts, the pure parts: groups, each node's command line and
environment, and the group's preflight rules on recorded observations."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.errors import UsageError
from fleet.inventory import HostSpec
from fleet.serving.multinode import Offers, judge_group, node_of, split_groups
from fleet.serving.observed import PreflightAnswer
from fleet.serving.profile import ProfileError, for_host
from fleet.serving.status import StopReport, node_label, rest_of_groups

HOSTS = [
    HostSpec(name=f"h{i}", address=f"10.0.0.{i}", python="/env/bin/python",
             vars={"models_dir": "/m"})
    for i in range(1, 5)
]  # fmt: skip
PROFILE = for_host("kimi-eagle3-pp2", HOSTS[0])
GPU_CSV = "".join(f"{i}, NVIDIA H200, 143771, 0, 570.1\n" for i in range(8))
FOUR_GPUS = "".join(GPU_CSV.splitlines(True)[:4])


def answer(**node: Any) -> PreflightAnswer:
    doc: dict[str, Any] = {
        "home": "/root",
        "vllm": {"version": "0.17.0", "offers": {"nnodes": True, "headless": True}},
        "gpus": {"exit_code": 0, "stdout": GPU_CSV, "stderr": ""},
        "node": {"address_local": True, "ports": {}, "peers": {}, **node},
    }
    return PreflightAnswer.model_validate(doc)


def test_hosts_split_in_inventory_order_heads_first() -> None:
    groups = split_groups(HOSTS, 2)
    assert [[m.host.name for m in g.members] for g in groups] == [["h1", "h2"], ["h3", "h4"]]
    assert [g.head.host.name for g in groups] == ["h1", "h3"]
    assert groups[0].members[1].role == "worker" and groups[0].head.role == "head"
    with pytest.raises(UsageError, match="do not split into groups of 2"):
        split_groups(HOSTS[:3], 2)


def test_mp_the_worker_is_headless_and_every_node_gets_its_address() -> None:
    group = split_groups(HOSTS[:2], 2)[0]
    offers = Offers(distributed_timeout=True, engine_ready_timeout=True)
    head, worker = (node_of(m, group, PROFILE, offers, 3600.0) for m in group.members)
    args = PROFILE.vllm_args(worker)
    assert args[args.index("--node-rank") + 1] == "1" and "--headless" in args
    assert args[args.index("--master-addr") + 1] == "10.0.0.1"
    assert args[args.index("--distributed-executor-backend") + 1] == "mp"
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    assert args[args.index("--distributed-timeout-seconds") + 1] == "3600"
    assert "--headless" not in PROFILE.vllm_args(head)
    assert worker.env(PROFILE)["VLLM_HOST_IP"] == "10.0.0.2"
    assert head.env(PROFILE)["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600"
    # a vLLM that offers neither timeout gets neither
    bare = node_of(group.members[1], group, PROFILE, Offers(), 3600.0)
    assert "--distributed-timeout-seconds" not in PROFILE.vllm_args(bare)
    assert "VLLM_ENGINE_READY_TIMEOUT_S" not in bare.env(PROFILE)


def test_ray_the_head_alone_runs_vllm_after_the_cluster() -> None:
    profile = PROFILE.model_copy(update={"distributed_backend": "ray"})
    group = split_groups(HOSTS[:2], 2)[0]
    head, worker = (node_of(m, group, profile, Offers(), 3600.0) for m in group.members)
    assert head.runs_vllm and not worker.runs_vllm
    assert "--nnodes" not in profile.vllm_args(head)
    assert worker.ray_argv(profile, "/env/bin/ray")[-1] == "--address=10.0.0.1:6379"
    assert "--head" in head.ray_argv(profile, "/env/bin/ray")
    assert head.env(profile)["RAY_ADDRESS"] == "10.0.0.1:6379"


def test_a_profile_across_nodes_names_its_backend_and_splits_evenly() -> None:
    raw = PROFILE.model_dump()
    with pytest.raises(ValueError, match="distributed_backend"):
        type(PROFILE).model_validate({**raw, "distributed_backend": None})
    with pytest.raises(ValueError, match="split evenly"):
        type(PROFILE).model_validate({**raw, "nodes": 3})
    with pytest.raises(ProfileError):
        for_host(
            "kimi-eagle3-pp2", HOSTS[0].model_copy(update={"vars": {"distributed_backend": "x"}})
        )


def ids(check: Any) -> dict[str, list[str]]:
    return {h: [d.id for d in ds] for h, ds in check.diagnoses.items()}


def test_a_good_group_passes() -> None:
    group = split_groups(HOSTS[:2], 2)[0]
    answers = {"h1": answer(), "h2": answer()}
    assert ids(judge_group(PROFILE, group, answers)) == {}


@pytest.mark.parametrize(
    ("change", "host", "expected"),
    [
        (lambda a: a["h2"].vllm.__setattr__("version", "0.16.0"), "h2", "node-mismatch"),
        (lambda a: a["h1"].vllm.__setattr__("offers", {}), "h1", "multinode-unsupported"),
        (lambda a: a["h2"].__setattr__("gpus", {"exit_code": 0, "stdout": FOUR_GPUS,
                                                "stderr": ""}), "h2", "tp-size-invalid"),
        (lambda a: a["h1"].node.__setattr__("ports", {"29501": {"free": False}}), "h1",
         "port-in-use"),
        (lambda a: a["h1"].node.__setattr__(
            "peers", {"h2": {"ok": False, "address": "10.0.0.2", "port": 22,
                             "error": "No route to host"}}), "h2", "node-unreachable"),
        (lambda a: a["h2"].node.__setattr__("address_local", False), "h2",
         "network-interface-wrong"),
    ],
)  # fmt: skip
def test_each_group_problem_is_its_diagnosis(change: Any, host: str, expected: str) -> None:
    group = split_groups(HOSTS[:2], 2)[0]
    answers = {"h1": answer(), "h2": answer()}
    change(answers)
    found = ids(judge_group(PROFILE, group, answers))
    assert expected in found.get(host, []), found


def test_a_half_patched_group_and_a_node_rendered_otherwise_are_refused() -> None:
    group = split_groups(HOSTS[:2], 2)[0]
    answers = {"h1": answer(), "h2": answer()}
    shas = {"h1": {"deepseek_v2.py": "aa"}, "h2": {"deepseek_v2.py": "bb"}}
    check = judge_group(PROFILE, group, answers, shas)
    (mismatch,) = check.diagnoses["h2"]
    assert mismatch.id == "node-mismatch" and mismatch.fix == "fleet patch --host h2"
    other = PROFILE.model_copy(update={"master_port": 29999})
    check = judge_group(PROFILE, group, answers, None, {"h1": PROFILE, "h2": other})
    assert "master_port" in check.diagnoses["h2"][0].evidence[0].text


def test_duplicate_node_addresses_are_refused() -> None:
    twins = [
        h.model_copy(update={"vars": {**h.vars, "node_address": "10.9.9.9"}}) for h in HOSTS[:2]
    ]
    group = split_groups(twins, 2)[0]
    found = ids(judge_group(PROFILE, group, {"h1": answer(), "h2": copy.deepcopy(answer())}))
    assert "node-ip-duplicate" in found["h1"]


def test_the_launch_record_names_the_node_and_its_group() -> None:
    group = split_groups(HOSTS[:2], 2)[0]
    worker = node_of(group.members[1], group, PROFILE, Offers(), 3600.0)
    record = worker.record()
    assert record["role"] == "worker" and record["rank"] == 1 and record["count"] == 2
    assert record["group"] == "h1" and record["members"] == ["h1", "h2"]
    assert node_label(record) == "worker 1 of 2"
    assert node_label(record, "kimi-eagle3-pp2-ray") == "worker 1 of 2, Ray node"
    assert node_label(None) is None and node_label({}) is None


def test_stopping_part_of_a_group_stops_the_rest_and_names_what_it_cannot() -> None:
    group = split_groups(HOSTS[:2], 2)[0]
    records = {m.host.name: node_of(m, group, PROFILE, Offers(), 1.0).record()
               for m in group.members}  # fmt: skip
    inventory = {h.name: h for h in HOSTS}

    def report(name: str, node: dict[str, Any] | None) -> StopReport:
        return StopReport(profile="p", was_running=True, state="STOPPED", node=node)

    # the worker alone: its head is stopped with it
    rest, warnings = rest_of_groups({"h2": report("h2", records["h2"])}, inventory)
    assert [(h.name, of) for h, of in rest] == [("h1", "h2")] and not warnings
    # the whole group, or a server on one host: nothing more
    both = {n: report(n, records[n]) for n in ("h1", "h2")}
    assert rest_of_groups(both, inventory) == ([], [])
    assert rest_of_groups({"h3": report("h3", None)}, inventory) == ([], [])
    # a member gone from the inventory, a record without members: warned, not guessed
    rest, warnings = rest_of_groups({"h2": report("h2", records["h2"])}, {"h2": HOSTS[1]})
    assert rest == [] and "h1" in warnings[0] and "not in the inventory" in warnings[0]
    old = {k: v for k, v in records["h2"].items() if k not in ("members", "group")}
    rest, warnings = rest_of_groups({"h2": report("h2", old)}, inventory)
    assert rest == [] and "worker 1 of 2" in warnings[0]


def test_the_interface_env_must_agree_and_vllm_host_ip_is_each_node_s_own() -> None:
    group = split_groups(HOSTS[:2], 2)[0]
    answers = {"h1": answer(), "h2": answer()}
    on_ib = PROFILE.model_copy(update={"env": {**PROFILE.env, "NCCL_SOCKET_IFNAME": "ib0"}})
    on_eth = PROFILE.model_copy(update={"env": {**PROFILE.env, "NCCL_SOCKET_IFNAME": "eth0"}})
    check = judge_group(on_ib, group, answers, None, {"h1": on_ib, "h2": on_eth})
    (mismatch,) = check.diagnoses["h2"]
    assert mismatch.id == "node-mismatch", mismatch
    assert mismatch.evidence[0].text.endswith("env NCCL_SOCKET_IFNAME: 'eth0' here, 'ib0' on h1")
    assert judge_group(on_ib, group, answers, None, {"h1": on_ib, "h2": on_ib}).diagnoses == {}
    # one VLLM_HOST_IP for every node (a static env entry): not a node's own address
    pinned = PROFILE.model_copy(update={"env": {**PROFILE.env, "VLLM_HOST_IP": "10.0.0.1"}})
    found = ids(judge_group(pinned, group, answers, None, {"h1": pinned, "h2": pinned}))
    assert found == {"h2": ["network-interface-wrong"]}, found


def test_a_node_without_the_profile_s_interface_is_refused() -> None:
    group = split_groups(HOSTS[:2], 2)[0]
    on_ib = PROFILE.model_copy(update={"node_interface": "ib0"})
    answers = {"h1": answer(interface={"name": "ib0", "exists": True}),
               "h2": answer(interface={"name": "ib0", "exists": False})}  # fmt: skip
    check = judge_group(on_ib, group, answers)
    assert ids(check) == {"h2": ["network-interface-wrong"]}
    assert "no interface ib0 on h2" in check.diagnoses["h2"][0].evidence[0].text

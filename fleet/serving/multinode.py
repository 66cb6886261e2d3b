"""One model across several hosts (pure): groups, each node's part, the group's preflight.

A profile with ``nodes: N`` serves one model over N hosts. The hosts selected are split,
in inventory order, into groups of N; the first host of a group is its head (it serves
HTTP; readiness is asked there only), the others are workers. fleet drives vLLM's own
multi-node modes, never its own:

- ``mp`` (vLLM 0.11.1+): every node runs ``vllm serve`` with ``--distributed-executor-
  backend mp --nnodes N --node-rank R --master-addr HEAD --master-port P``; the workers add
  ``--headless`` (no API server) and are started first, the head last, within torch's
  rendezvous window.
- ``ray``: a Ray cluster first (``ray start --head`` on the head, ``ray start --address``
  on the workers, each supervised like the server), fleet waits until every node has
  joined, then ``vllm serve --distributed-executor-backend ray`` runs on the head alone.

Every node gets ``VLLM_HOST_IP`` (the address the other nodes reach it at: the host
variable ``node_address``, else its inventory address), ``VLLM_PORT`` from the profile's
``vllm_port_base`` (the head's extra sockets in a known range instead of random ports),
``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` from ``node_interface``, and the timeouts
the installed vLLM offers set from the load budget (``--distributed-timeout-seconds``,
``VLLM_ENGINE_READY_TIMEOUT_S``); where it offers none, preflight says so.

Facts: docs/research/vllm-serve.md section 4 (flags per version, mechanics, failure texts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fleet.diagnosis.factory import diagnosis
from fleet.errors import UsageError

if TYPE_CHECKING:
    from fleet.diagnosis.models import Diagnosis
    from fleet.inventory import HostSpec
    from fleet.serving.observed import PreflightAnswer
    from fleet.serving.profile import Profile

DistributedBackend = Literal["mp", "ray"]  # the profile's distributed_backend
MP_SINCE = (0, 11, 1)  # --nnodes/--node-rank/--master-addr/--headless
RAY_SUFFIX = "-ray"  # the Ray node of profile P runs as its own program P-ray
VLLM_PORT_SPAN = 16  # ports from vllm_port_base the head may open (checked free)


def node_address(host: HostSpec) -> str:
    """The address the other nodes reach ``host`` at (``node_address``, else its address)."""
    value = host.vars.get("node_address")
    return str(value) if value else host.target


@dataclass(frozen=True)
class Member:
    host: HostSpec
    rank: int
    address: str

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


@dataclass(frozen=True)
class Group:
    """N hosts serving one model; named after its head."""

    members: tuple[Member, ...]

    @property
    def head(self) -> Member:
        return self.members[0]

    @property
    def name(self) -> str:
        return self.head.host.name

    @property
    def workers(self) -> tuple[Member, ...]:
        return self.members[1:]

    def describe(self) -> str:
        return ", ".join(f"{m.host.name} ({m.role} {m.rank})" for m in self.members)


def split_groups(hosts: Sequence[HostSpec], nodes: int) -> list[Group]:
    """The hosts, in inventory order, as groups of ``nodes`` (the first of each: the head).
    Hosts that do not fill a group are bad input (exit 2)."""
    if nodes < 1:
        raise UsageError(f"nodes: {nodes}: must be at least 1")
    if len(hosts) % nodes:
        names = ", ".join(h.name for h in hosts)
        raise UsageError(
            f"{len(hosts)} host(s) ({names}) do not split into groups of {nodes}: select "
            f"a multiple of {nodes} hosts (a group of the inventory, in order)"
        )
    out = []
    for start in range(0, len(hosts), nodes):
        chunk = hosts[start : start + nodes]
        out.append(Group(tuple(Member(h, i, node_address(h)) for i, h in enumerate(chunk))))
    return out


@dataclass(frozen=True)
class Offers:
    """What the installed vLLM offers for a multi-node start (read from its source)."""

    version: tuple[int, ...] = (0, 0, 0)
    multinode_mp: bool = False  # --nnodes, --headless
    distributed_timeout: bool = False  # --distributed-timeout-seconds (0.18+)
    engine_ready_timeout: bool = False  # VLLM_ENGINE_READY_TIMEOUT_S (0.14+)

    @classmethod
    def of(cls, answer: PreflightAnswer) -> Offers:
        from fleet.onhost.families import version_tuple

        seen = answer.vllm.offers
        return cls(
            version=version_tuple(answer.vllm.version or "0"),
            multinode_mp=bool(seen.get("nnodes")) and bool(seen.get("headless")),
            distributed_timeout=bool(seen.get("distributed_timeout_seconds")),
            engine_ready_timeout=bool(seen.get("engine_ready_timeout")),
        )


@dataclass(frozen=True)
class Node:
    """One host's part of a server across nodes: what it runs and with which settings."""

    rank: int
    count: int
    address: str
    head_address: str
    backend: DistributedBackend
    budget_s: float
    offers: Offers = field(default_factory=Offers)
    ray_program: bool = False  # this node's `ray start` (not vLLM)
    group: str = ""  # the group's name (its head's inventory name)
    members: tuple[str, ...] = ()  # every node's inventory name, by rank

    @property
    def head(self) -> bool:
        return self.rank == 0

    @property
    def role(self) -> str:
        return "head" if self.head else "worker"

    def record(self) -> dict[str, Any]:
        """What the launch record keeps of this node (``fleet status``, ``logs`` and
        ``stop`` read it back: who the node is, and which hosts make up its group)."""
        return {"rank": self.rank, "count": self.count, "role": self.role,
                "address": self.address, "group": self.group,
                "members": list(self.members)}  # fmt: skip

    @property
    def runs_vllm(self) -> bool:
        """Ray: only the head runs ``vllm serve`` (its workers are the Ray cluster's)."""
        return self.backend == "mp" or self.head

    def vllm_args(self, profile: Profile) -> list[str]:
        args = ["--distributed-executor-backend", self.backend]
        if self.backend == "mp":
            args += [
                "--nnodes", str(self.count), "--node-rank", str(self.rank),
                "--master-addr", self.head_address, "--master-port", str(profile.master_port),
            ]  # fmt: skip
            if not self.head:
                args.append("--headless")
        if self.offers.distributed_timeout:
            args += ["--distributed-timeout-seconds", str(int(self.budget_s))]
        return args

    def env(self, profile: Profile) -> dict[str, str]:
        out = {"VLLM_HOST_IP": self.address}
        if profile.vllm_port_base is not None:
            out["VLLM_PORT"] = str(profile.vllm_port_base)
        if profile.node_interface:
            out["GLOO_SOCKET_IFNAME"] = profile.node_interface
            out["NCCL_SOCKET_IFNAME"] = profile.node_interface
        if self.offers.engine_ready_timeout:
            out["VLLM_ENGINE_READY_TIMEOUT_S"] = str(int(self.budget_s))
        if self.backend == "ray" and not self.ray_program:
            out["RAY_ADDRESS"] = f"{self.head_address}:{profile.ray_port}"
        if self.ray_program:
            out["RAY_USAGE_STATS_ENABLED"] = "0"
        return out

    def ray_argv(self, profile: Profile, ray: str) -> list[str]:
        """``ray start --block`` for this node (the supervised program ``P-ray``)."""
        argv = [ray, "start", "--block", f"--node-ip-address={self.address}",
                f"--num-gpus={profile.gpus_per_node}", "--disable-usage-stats"]  # fmt: skip
        if self.head:
            argv += ["--head", f"--port={profile.ray_port}", "--include-dashboard=false"]
        else:
            argv.append(f"--address={self.head_address}:{profile.ray_port}")
        return argv


def node_of(member: Member, group: Group, profile: Profile, offers: Offers, budget: float) -> Node:
    assert profile.distributed_backend is not None
    return Node(
        rank=member.rank,
        count=len(group.members),
        address=member.address,
        head_address=group.head.address,
        backend=profile.distributed_backend,
        budget_s=budget,
        offers=offers,
        group=group.name,
        members=tuple(m.host.name for m in group.members),
    )


# -- the group's preflight (pure: every node's observations together) ----------------------


def _field(profile: Profile, name: str) -> Any:
    """A shared field of a rendered profile, or ``env NAME`` (one of its env entries)."""
    if name.startswith("env "):
        return profile.env.get(name[4:])
    return getattr(profile, name, None)


@dataclass
class GroupCheck:
    diagnoses: dict[str, list[Diagnosis]] = field(default_factory=dict)  # by host
    notes: list[str] = field(default_factory=list)

    def add(self, host: str, found: Diagnosis) -> None:
        self.diagnoses.setdefault(host, []).append(found)


# what every node's rendered profile must agree on (paths may differ per host)
SHARED_FIELDS = (
    "tensor_parallel_size", "pipeline_parallel_size", "nodes", "distributed_backend",
    "master_port", "ray_port", "vllm_port_base", "node_interface", "served_model_name",
    "max_model_len", "trust_remote_code",
)  # fmt: skip
# the interface the nodes talk over, when the profile's env names it instead of
# node_interface: the same on every node, like node_interface
SHARED_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def judge_group(
    profile: Profile,
    group: Group,
    answers: dict[str, PreflightAnswer],
    patch_shas: dict[str, dict[str, str | None]] | None = None,
    profiles: dict[str, Profile] | None = None,
) -> GroupCheck:
    """What only the nodes together can tell: the same vLLM and the same patched files on
    every node, GPUs x nodes = the parallel sizes, the backend and the timeouts this vLLM
    offers, the head's ports free, every node reachable from the others at the address it
    will use, its address its own, the interface present and set alike."""
    out = GroupCheck()
    head = group.head.host.name

    def found(host: str, rule: str, evidence: list[str], **values: Any) -> None:
        out.add(host, diagnosis(rule, host=host, evidence=evidence, seen_by="group preflight",
                                **values))  # fmt: skip

    for member in group.workers:
        mine = (profiles or {}).get(member.host.name)
        if mine is None:
            continue
        differ = [f for f in SHARED_FIELDS if getattr(mine, f) != getattr(profile, f)]
        differ += [f"env {k}" for k in SHARED_ENV if mine.env.get(k) != profile.env.get(k)]
        spec = ("method", "num_speculative_tokens", "draft_tensor_parallel_size")
        if (mine.speculative is None) != (profile.speculative is None) or any(
            getattr(mine.speculative, f, None) != getattr(profile.speculative, f, None)
            for f in spec
        ):
            differ.append("speculative")  # the drafter's path may differ per host
        if differ:
            found(member.host.name, "node-mismatch",
                  [f"{f}: {_field(mine, f)!r} here, {_field(profile, f)!r} on {head}"
                   for f in differ], what="profile " + ", ".join(differ), head=head)  # fmt: skip
    versions = {m.host.name: answers[m.host.name].vllm.version for m in group.members}
    if len(set(versions.values())) > 1:
        seen = ", ".join(f"{h} {v}" for h, v in versions.items())
        for host, version in versions.items():
            if version != versions[head]:
                found(host, "node-mismatch", [f"vLLM versions: {seen}"], what="vLLM version",
                      head=head, fix_hint="install the head's vLLM")  # fmt: skip
    if patch_shas:
        head_shas = patch_shas.get(head) or {}
        for member in group.workers:
            name = member.host.name
            shas = patch_shas.get(name) or {}
            differ = sorted(
                p for p in set(head_shas) | set(shas) if head_shas.get(p) != shas.get(p)
            )
            if differ:
                found(name, "node-mismatch",
                      [f"{p}: {str(shas.get(p))[:12]} here, {str(head_shas.get(p))[:12]} on {head}"
                       for p in differ[:5]],
                      what="patched vLLM files", head=head)  # fmt: skip
    # GPUs x nodes = tp x pp
    from fleet.facts.parsers import parse_gpu_part

    wanted = profile.gpus_per_node
    for member in group.members:
        gpus, _status, _error = parse_gpu_part(answers[member.host.name].gpus)
        if gpus and len(gpus) < wanted:
            found(member.host.name, "tp-size-invalid",
                  [f"{len(gpus)} GPUs on {member.host.name}; tensor_parallel_size "
                   f"{profile.tensor_parallel_size} x pipeline_parallel_size "
                   f"{profile.pipeline_parallel_size} over {profile.nodes} nodes needs {wanted}"],
                  tp=profile.tensor_parallel_size, gpus=len(gpus),
                  message=f"{profile.world_size} ranks over {profile.nodes} nodes need "
                  f"{wanted} GPUs per node")  # fmt: skip
    offers = Offers.of(answers[head])
    if profile.distributed_backend == "mp" and not offers.multinode_mp:
        found(head, "multinode-unsupported",
              [f"vLLM {versions[head]} has no --nnodes/--headless (vLLM's multi-node mode is "
               "0.11.1+)"], version=versions[head])  # fmt: skip
    if not offers.distributed_timeout:
        out.notes.append(
            f"vLLM {versions[head]} offers no --distributed-timeout-seconds: torch's default "
            "(600 s) bounds the rendezvous and collectives; fleet starts the nodes together"
        )
    if not offers.engine_ready_timeout:
        out.notes.append(
            f"vLLM {versions[head]} reads no VLLM_ENGINE_READY_TIMEOUT_S: its own wait for the "
            "engine cannot be raised to the load budget"
        )
    # the head's ports
    ports = answers[head].node.ports
    for port, state in sorted(ports.items(), key=lambda kv: int(kv[0])):
        if not state.get("free", True):
            found(head, "port-in-use", [f"bind({group.head.address}:{port}) on the head: "
                                        f"{state.get('error') or 'in use'}"], port=port,
                  holder=state.get("holder"))  # fmt: skip
    # every node: its address is its own, the others reach it, the interface is there
    for member in group.members:
        name = member.host.name
        node = answers[name].node
        if node.address_local is False:
            found(name, "network-interface-wrong",
                  [f"{member.address} (VLLM_HOST_IP) is not an address of {name} "
                   f"({node.address_error})"],
                  what=f"VLLM_HOST_IP {member.address} is not an address of {name}",
                  node=name)  # fmt: skip
        for peer, reach in sorted(node.peers.items()):
            if not reach.get("ok"):
                found(peer, "node-unreachable",
                      [f"{name} cannot reach {peer} at {reach.get('address')}:"
                       f"{reach.get('port')}: {reach.get('error')}"],
                      node=peer, source=name, address=reach.get("address"))  # fmt: skip
        iface = profile.node_interface
        if iface and not (node.interface or {}).get("exists", False):
            found(name, "network-interface-wrong",
                  [f"no interface {iface} on {name} (GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME)"],
                  what=f"{name} has no interface {iface}", node=name)  # fmt: skip
    # VLLM_HOST_IP is each node's own (fleet sets it from node_address, over the env's)
    for member in group.members:
        mine = (profiles or {}).get(member.host.name) or (profile if member is group.head else None)
        ip = mine.env.get("VLLM_HOST_IP") if mine is not None else None
        if ip and ip != member.address:
            found(member.host.name, "network-interface-wrong",
                  [f"profile env VLLM_HOST_IP {ip} on {member.host.name}, its node address "
                   f"{member.address}"],
                  what=f"the profile's env sets VLLM_HOST_IP {ip} on {member.host.name}; fleet "
                  f"gives each node its node_address ({member.address}): set the host "
                  "variable node_address instead", node=member.host.name)  # fmt: skip
    addresses = [m.address for m in group.members]
    if len(set(addresses)) < len(addresses):
        found(head, "node-ip-duplicate", [f"node addresses {addresses}"],
              addresses=", ".join(addresses))  # fmt: skip
    return out

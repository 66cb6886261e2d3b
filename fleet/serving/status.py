"""``fleet status`` and ``fleet stop`` on one host (one on-host call each), and which log
of a profile ``fleet logs`` reads on a host.

A profile's state comes from its supervisor and its log: ``ready`` (running, /health 200),
``loading`` (running; the phase and percent read from the log's last bytes by the phase
tracker), ``starting``, ``crashed`` (the process exited on its own: vLLM exits 0 when its
engine dies after start-up, so any exit not asked for by ``fleet stop`` is a crash) or
``stopped``.

A server across hosts (``nodes: N``) is one server: every node's launch record names its
rank, role and group (the group's hosts by name). ``fleet stop`` of some of a group's hosts
stops the whole group (:func:`rest_of_groups`: a node stopped alone leaves the others
holding their GPUs with a server that cannot answer), and on a Ray worker, which runs only
its Ray node (``P-ray``), ``fleet logs P`` reads that program's log (:func:`profile_log`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet.facts.parsers import parse_gpu_part
from fleet.serving import host_calls
from fleet.transport.outcome import Verdict

if TYPE_CHECKING:
    from fleet.inventory import HostSpec
    from fleet.transport import Runner

RUNNING = ("RUNNING", "STARTING", "BACKOFF")
# a worker node (no HTTP of its own) whose log went past these is done loading its ranks
WORKER_DONE = ("kv-cache", "cuda-graphs", "api-server", "ready")
CRASHED = ("EXITED", "FATAL", "UNKNOWN")


@dataclass
class ProfileReport:
    name: str
    state: str
    phase: str
    percent: float | None = None
    pid: int | None = None
    uptime_s: float | None = None
    endpoint: str | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    supervisor_state: str | None = None
    node: dict[str, Any] | None = None  # a server across hosts: this host's rank and role

    def to_json(self) -> dict[str, Any]:
        return {
            **({"node": self.node} if self.node else {}),
            "state": self.state,
            "phase": self.phase,
            "percent": self.percent,
            "pid": self.pid,
            "uptime_s": None if self.uptime_s is None else round(self.uptime_s, 1),
            "endpoint": self.endpoint,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "supervisor_state": self.supervisor_state,
        }


def report_of(name: str, entry: host_calls.ProfileStatus, address: str) -> ProfileReport:
    """One profile's state (pure: from the on-host answer)."""
    from fleet.serving.phases import PhaseTracker
    from fleet.serving.readiness import acceptance, parse_metrics

    sup = entry.program.state
    tracker = PhaseTracker(None)
    tracker.feed_text(entry.tail_bytes().decode("utf-8", errors="replace").replace("\r", "\n"))
    progress = tracker.progress
    port = entry.launch.get("port")
    started = entry.launch.get("started_at")
    node = entry.launch.get("node")
    out = ProfileReport(
        name=name, state="stopped", phase=progress.phase, supervisor_state=sup,
        node=node if isinstance(node, dict) else None,
    )  # fmt: skip
    if sup in RUNNING:
        out.pid = entry.program.pid
        if isinstance(started, int | float):
            out.uptime_s = max(0.0, entry.now - started)
        if entry.health == 200:
            out.state, out.phase = "ready", "ready"
            out.endpoint = f"http://{address}:{port}" if port else None
        elif out.node and out.node.get("role") == "worker" and progress.phase in WORKER_DONE:
            # a worker of a server across hosts serves no HTTP: its ranks are loaded
            out.state = "ready"
        else:
            out.state = "starting" if progress.phase == "starting" else "loading"
            out.percent = progress.percent
        if entry.metrics:
            spec = acceptance(parse_metrics(""), parse_metrics(entry.metrics))
            out.acceptance_rate = spec.acceptance_rate
            out.mean_acceptance_length = spec.mean_acceptance_length
    elif sup in CRASHED:
        out.state = "crashed"
    return out


def node_label(node: dict[str, Any] | None, program: str | None = None) -> str | None:
    """``worker 1 of 2`` (``, Ray node`` for the Ray program P-ray): a node of a server
    across hosts as its launch record names it; None for a server on one host."""
    from fleet.serving.multinode import RAY_SUFFIX

    if not node or node.get("role") is None:
        return None
    text = f"{node.get('role')} {node.get('rank')}"
    if node.get("count"):
        text += f" of {node.get('count')}"
    if program and program.endswith(RAY_SUFFIX):
        text += ", Ray node"
    return text


def host_status(conn: Runner, profile: str | None = None) -> list[ProfileReport]:
    answer = host_calls.status(conn, [profile] if profile else None, metrics=True)
    address = conn.host.target
    return [report_of(name, entry, address) for name, entry in sorted(answer.profiles.items())]


@dataclass
class StopReport:
    profile: str
    was_running: bool
    state: str
    pid: int | None = None
    stopped_in_s: float | None = None
    gpu_memory_used_mib: int | None = None
    node: dict[str, Any] | None = None  # a server across hosts: this host's rank and role
    group_of: str | None = None  # not selected: stopped as a node of this host's group

    def verdict(self) -> Verdict:
        if self.was_running and self.state in RUNNING:
            return Verdict("failed", "supervisor-failed", f"still {self.state.lower()}")
        return Verdict("changed" if self.was_running else "ok")

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "was_running": self.was_running,
            "already_stopped": not self.was_running,
            "state": self.state,
            "pid": self.pid,
            "stopped_in_s": self.stopped_in_s,
            "gpu_memory_used_mib": self.gpu_memory_used_mib,
            **({"node": self.node} if self.node else {}),
            **({"stopped_with_group_of": self.group_of} if self.group_of else {}),
        }


def stop_host(conn: Runner, host: HostSpec, profile_name: str) -> StopReport:
    from fleet.serving.profile import for_host

    profile = for_host(profile_name, host)
    grace = profile.stop_grace_s
    answer = host_calls.stop(conn, profile_name, timeout=grace + 30)
    if profile.distributed_backend == "ray":  # this host's Ray node of the server
        from fleet.serving.multinode import RAY_SUFFIX

        ray = host_calls.stop(conn, profile_name + RAY_SUFFIX, timeout=grace + 30)
        node = answer.node or ray.node  # a Ray worker runs only its Ray node
        if ray.was_running and not answer.was_running:
            answer = ray
        answer.node = node
    gpus, _status, _error = parse_gpu_part(answer.gpus)
    used = [g.memory_used_mib for g in gpus if g.memory_used_mib is not None]
    return StopReport(
        profile=profile_name,
        was_running=answer.was_running,
        state=answer.state,
        pid=answer.pid,
        stopped_in_s=answer.stopped_in_s,
        gpu_memory_used_mib=sum(used) if used else None,
        node=answer.node if isinstance(answer.node, dict) else None,
    )


def rest_of_groups(
    reports: dict[str, StopReport], inventory: dict[str, HostSpec]
) -> tuple[list[tuple[HostSpec, str]], list[str]]:
    """The hosts of the stopped hosts' groups that were not selected (each with the
    selected host whose group it completes), and a warning for each member fleet cannot
    stop (no longer in the inventory, or a launch record that does not name its group).

    A server across hosts is one server: stopping one node leaves the others holding
    their GPUs with a server that cannot answer (mp: the head waits in its collectives
    until torch's timeout; a headless worker keeps retrying a head that is gone; Ray: the
    head's placement group loses the node's bundles), so the whole group stops, as it
    does when a node crashes under ``fleet serve``."""
    extra: list[tuple[HostSpec, str]] = []
    warnings: list[str] = []
    wanted = set(reports)
    for name, report in reports.items():
        node = report.node or {}
        if not node.get("role"):
            continue  # a server on one host
        members = [str(m) for m in node.get("members") or []]
        if not members:
            if int(node.get("count") or 1) > 1:
                warnings.append(
                    f"{name} is {node_label(node)} of a server across hosts whose launch "
                    "record does not name the other nodes: stop them too (fleet stop "
                    "PROFILE --host <the group>)"
                )
            continue
        for member in members:
            if member in wanted:
                continue
            wanted.add(member)
            host = inventory.get(member)
            if host is None:
                warnings.append(f"{member} ({name}'s group) is not in the inventory: stop it there")
                continue
            extra.append((host, name))
    return extra, warnings


@dataclass(frozen=True)
class ProfileLog:
    """The log ``fleet logs PROFILE`` reads on a host: its program's, with the node."""

    program: str
    path: str
    node: dict[str, Any] | None = None

    @property
    def label(self) -> str | None:
        return node_label(self.node, self.program)


def profile_log(conn: Runner, host: HostSpec, profile_name: str) -> ProfileLog:
    """Which log of the profile this host holds. A server on one host: its vLLM's (no
    call to the host). A server across hosts: the host's launch records say which of the
    profile's programs it runs -- its vLLM, or on a Ray worker (whose ranks are Ray
    actors of the head's vLLM) only its Ray node ``P-ray`` -- and its rank and role; a
    running program first, else the last launched, the vLLM's before the Ray node's."""
    from fleet.diagnosis.host_logs import profile_log_path
    from fleet.serving.multinode import RAY_SUFFIX

    plain = ProfileLog(profile_name, profile_log_path(profile_name))
    if not across_nodes(profile_name, host):
        return plain
    names = [profile_name, profile_name + RAY_SUFFIX]
    answer = host_calls.status(conn, names, tail=False)
    launched = [(n, e) for n, e in answer.profiles.items() if n in names and e.launch]
    launched.sort(key=lambda ne: names.index(ne[0]))
    if not launched:
        return plain
    running = [(n, e) for n, e in launched if e.program.state in RUNNING]
    if running:
        name, entry = running[0]
    else:  # the last launched (the vLLM's on a tie)
        name, entry = max(launched, key=lambda ne: float(ne[1].launch.get("started_at") or 0))
    node = entry.launch.get("node")
    return ProfileLog(name, profile_log_path(name), node if isinstance(node, dict) else None)


def across_nodes(profile_name: str, host: HostSpec) -> bool:
    """Does the profile, rendered for ``host``, serve one model across several hosts?
    (A name that is no playbook here is read as a server on one host.)"""
    from fleet.serving.profile import ProfileError, for_host

    try:
        return for_host(profile_name, host).nodes > 1
    except ProfileError:
        return False

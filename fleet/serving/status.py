"""``fleet status`` and ``fleet stop`` on one host (one on-host call each).

A profile's state comes from its supervisor and its log: ``ready`` (running, /health 200),
``loading`` (running; the phase and percent read from the log's last bytes by the phase
tracker), ``starting``, ``crashed`` (the process exited on its own: vLLM exits 0 when its
engine dies after start-up, so any exit not asked for by ``fleet stop`` is a crash) or
``stopped``.
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
        }


def stop_host(conn: Runner, host: HostSpec, profile_name: str) -> StopReport:
    from fleet.serving.profile import for_host

    profile = for_host(profile_name, host)
    grace = profile.stop_grace_s
    answer = host_calls.stop(conn, profile_name, timeout=grace + 30)
    if profile.distributed_backend == "ray":  # this host's Ray node of the server
        from fleet.serving.multinode import RAY_SUFFIX

        ray = host_calls.stop(conn, profile_name + RAY_SUFFIX, timeout=grace + 30)
        if ray.was_running and not answer.was_running:
            answer = ray
    gpus, _status, _error = parse_gpu_part(answer.gpus)
    used = [g.memory_used_mib for g in gpus if g.memory_used_mib is not None]
    return StopReport(
        profile=profile_name,
        was_running=answer.was_running,
        state=answer.state,
        pid=answer.pid,
        stopped_in_s=answer.stopped_in_s,
        gpu_memory_used_mib=sum(used) if used else None,
    )

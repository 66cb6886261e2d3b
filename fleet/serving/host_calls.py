"""The remote side of ``fleet serve``, ``status`` and ``stop``: one on-host call each.

The on-host script is ``fleet/onhost/serve.py`` (see it for what each operation does on
the host); the answers are validated here with pydantic models. Secrets travel in the
request on stdin only.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from fleet.onhost.client import run_onhost
from fleet.serving import supervisor, units
from fleet.serving.observed import PreflightAnswer
from fleet.serving.profile import Profile
from fleet.serving.supervisor import SupervisorName

if TYPE_CHECKING:
    from fleet.serving.multinode import Node
    from fleet.transport import Runner

SCRIPT = "serve"
PREFLIGHT_TIMEOUT = 120.0
LAUNCH_TIMEOUT = 300.0


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class LaunchAnswer(_Answer):
    """A launch (or the launch record of the server found running)."""

    name: str
    started_at: float
    pid: int | None = None
    log: str
    log_inode: int
    port: int | None = None
    state: str = "UNKNOWN"
    launch_id: str | None = None
    supervisor: str = "supervisord"
    supervisor_source: str | None = None
    resumed: bool = False  # this launch's own record: it ran before its answer was lost
    attached: bool = False  # another launch's server, already running: followed, not started


class ProgramState(_Answer):
    state: str = "STOPPED"
    supervisor: str = "supervisord"
    daemon: bool = False  # the supervisor itself answers (supervisord runs)
    pid: int | None = None
    description: str | None = None
    exit_status: str | None = None


class ProfileStatus(_Answer):
    program: ProgramState = Field(default_factory=ProgramState)
    launch: dict[str, Any] = Field(default_factory=dict)
    now: float = 0.0
    log_size: int | None = None
    log_tail: str | None = None
    health: int | None = None
    metrics: str | None = None

    def tail_bytes(self) -> bytes:
        return base64.b64decode(self.log_tail) if self.log_tail else b""


class StatusAnswer(_Answer):
    profiles: dict[str, ProfileStatus] = Field(default_factory=dict)


class RayNodesAnswer(_Answer):
    nodes: int = 0
    gpus: float | None = None
    output: str | None = None


def ray_nodes(conn: Runner, *, ray: str, address: str) -> RayNodesAnswer:
    """``ray status`` on the host: how many nodes the cluster at ``address`` has now."""
    request = {"op": "ray-nodes", "ray": ray, "address": address}
    return run_onhost(conn, SCRIPT, request, RayNodesAnswer, timeout=90)


class StopAnswer(_Answer):
    was_running: bool
    state: str
    pid: int | None = None
    stopped_in_s: float | None = None
    gpus: dict[str, Any] = Field(default_factory=dict)
    node: dict[str, Any] | None = None  # the launch record's part of a server across hosts


def preflight(
    conn: Runner, profile: Profile, node: dict[str, Any] | None = None
) -> PreflightAnswer:
    """The host's observations for preflight (``node``: its part of a server across hosts:
    its address, the ports it opens, its peers, the interface; checked from the host)."""
    python = conn.host.python
    seen: dict[str, Any] = {
        "name": profile.name,
        "model": profile.model,
        "drafter": profile.speculative.model if profile.speculative is not None else None,
        "host": "0.0.0.0" if profile.host in ("0.0.0.0", "::") else profile.host,
        "port": profile.port,
        "vllm": profile.vllm_executable(python),
    }
    if node is not None:
        seen["node"] = node
    request = {"op": "preflight", "profile": seen}
    return run_onhost(conn, SCRIPT, request, PreflightAnswer, timeout=PREFLIGHT_TIMEOUT)


def launch(
    conn: Runner,
    profile: Profile,
    *,
    home: str,
    secrets: dict[str, str],
    restart: bool,
    backend: SupervisorName,
    launch_id: str,
    node: Node | None = None,
    argv: list[str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> LaunchAnswer:
    """Write the profile's files and start it under ``backend`` (supervisord: fleet's own,
    installed from the wheel fleet pushes when the host has none). Safe to send again
    with the same ``launch_id`` after a dropped connection: the host starts it once.
    ``extra_args``: more ``vllm serve`` arguments this host's vLLM takes (e.g.
    ``--shutdown-timeout``). The launch record keeps the profile's fingerprint."""
    layout = units.Layout(home=home, profile=profile.name)
    python = conn.host.python or "python3"
    if argv is None and extra_args:
        argv = [profile.vllm_executable(python), "serve", *profile.vllm_args(node), *extra_args]
    request: dict[str, Any] = {
        "op": "launch",
        "name": profile.name,
        "port": profile.port,
        "restart": restart,
        "stop_timeout": profile.stop_grace_s + 30,
        "supervisor": backend,
        "launch_id": launch_id,
        "fingerprint": profile.fingerprint(),
        "files": supervisor.files(
            backend, profile, layout, python=python, secrets=units.secrets_file(secrets),
            node=node, argv=argv,
        ),
    }  # fmt: skip
    if node is not None:
        request["node"] = node.record()
    if backend == "supervisord":
        from fleet.wheels import supervisor_wheel

        path = supervisor_wheel()
        request["supervisor_wheel"] = base64.b64encode(path.read_bytes()).decode("ascii")
        request["supervisor_wheel_name"] = path.name
    return run_onhost(conn, SCRIPT, request, LaunchAnswer, timeout=LAUNCH_TIMEOUT)


def status(
    conn: Runner, names: list[str] | None = None, *, metrics: bool = False, tail: bool = True
) -> StatusAnswer:
    """Each profile's state (``tail``: with its log's last bytes, for the phase)."""
    request = {"op": "status", "names": names or [], "metrics": metrics, "tail": tail}
    return run_onhost(conn, SCRIPT, request, StatusAnswer)


def stop(conn: Runner, profile: str, *, timeout: float) -> StopAnswer:
    return run_onhost(
        conn, SCRIPT, {"op": "stop", "name": profile, "timeout": timeout}, StopAnswer,
        timeout=timeout + 60,
    )  # fmt: skip

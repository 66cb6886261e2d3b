"""What a host observed for ``fleet serve``'s preflight (``fleet/onhost/serve.py``
``op_preflight``), as typed models: the answer is validated once, and every preflight rule
reads fields, never ``.get() or {}`` chains. Odd values a host may send (a config.json
that is not an object, a missing part) become the empty or ``None`` value of the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Seen(BaseModel):
    model_config = ConfigDict(extra="allow")


class ConfigFile(_Seen):
    """A config.json as read: its object (``value``), or why there is none."""

    value: dict[str, Any] | None = None
    missing: bool = False
    error: str | None = None

    @field_validator("value", mode="before")
    @classmethod
    def _object(cls, value: Any) -> Any:
        return value if isinstance(value, dict) else None

    def problem(self) -> str | None:
        if self.value is not None:
            return None
        return "missing" if self.missing else (self.error or "unreadable")


class Weights(_Seen):
    indexed: list[str] = Field(default_factory=list)
    present: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    bytes: int = 0


class ModelDir(_Seen):
    """A model directory: a hub id (nothing to check), or a path and what it holds."""

    hub_id: str | None = None
    path: str | None = None
    exists: bool = False
    config: ConfigFile = Field(default_factory=ConfigFile)
    weights: Weights = Field(default_factory=Weights)

    @property
    def config_value(self) -> dict[str, Any] | None:
        return self.config.value


class VllmSeen(_Seen):
    path: str | None = None
    version: str | None = None
    models: dict[str, Any] = Field(default_factory=dict)
    allowlist: dict[str, Any] = Field(default_factory=dict)
    knows: dict[str, bool] = Field(default_factory=dict)
    offers: dict[str, bool] = Field(default_factory=dict)  # multi-node flags it defines


class PortSeen(_Seen):
    free: bool = True
    error: str | None = None
    note: str | None = None
    holder: str | None = None


class DiskUsageSeen(_Seen):
    path: str | None = None
    total: int | None = None
    used: int | None = None
    free: int | None = None


class DiskSeen(_Seen):
    home: DiskUsageSeen = Field(default_factory=DiskUsageSeen)
    error: str | None = None


class ExecutableSeen(_Seen):
    path: str | None = None
    ok: bool = True


class ProgramSeen(_Seen):
    state: str = "STOPPED"
    supervisor: str = "supervisord"
    daemon: bool = False
    pid: int | None = None
    description: str | None = None


class ServerSeen(_Seen):
    """The profile's server on the host: its supervisor's view, its launch record."""

    exists: bool = False
    lock_held: bool = False
    program: ProgramSeen = Field(default_factory=ProgramSeen)
    launch: dict[str, Any] = Field(default_factory=dict)
    health: int | None = None


class SupervisorSeen(_Seen):
    usable: bool = False
    why: str | None = None
    source: str | None = None


class NodeSeen(_Seen):
    """A node of a server across hosts, as it saw itself and its peers."""

    address: str | None = None
    address_local: bool | None = None
    address_error: str | None = None
    ports: dict[str, dict[str, Any]] = Field(default_factory=dict)
    peers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    interface: dict[str, Any] | None = None


class PreflightAnswer(_Seen):
    home: str
    python: str = ""
    vllm: VllmSeen = Field(default_factory=VllmSeen)
    target: ModelDir = Field(default_factory=ModelDir)
    drafter: ModelDir = Field(default_factory=ModelDir)
    gpus: dict[str, Any] = Field(default_factory=dict)  # nvidia-smi's raw answer
    port: PortSeen = Field(default_factory=PortSeen)
    disk: DiskSeen = Field(default_factory=DiskSeen)
    vllm_executable: ExecutableSeen = Field(default_factory=ExecutableSeen)
    server: ServerSeen = Field(default_factory=ServerSeen)
    supervisors: dict[str, SupervisorSeen] = Field(default_factory=dict)
    node: NodeSeen = Field(default_factory=NodeSeen)

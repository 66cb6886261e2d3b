"""Facts about one host, as pydantic models (the ``fleet inspect --json`` contract).

``HostFacts.model_dump(mode="json")`` plus ``"ok": true`` is one host's entry in
``fleet inspect --json`` (docs/contracts.md).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

# the model classes fleet inspect reports, and the model types checked against the
# config-time allowlist (defined with the on-host judgement that uses them)
from fleet.onhost.vllm_tree import ALLOWLIST_MODEL_TYPES as ALLOWLIST_MODEL_TYPES
from fleet.onhost.vllm_tree import EAGLE3_CLASSES as EAGLE3_CLASSES


class GpuInfo(BaseModel):
    index: int
    name: str
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    driver_version: str | None = None


class Eagle3ClassInfo(BaseModel):
    """How a model class was judged: SupportsEagle3 among its bases, followed in-file."""

    file: str
    line: int
    supported: bool
    via: list[str] = Field(
        default_factory=list,
        description="Inheritance chain from the class to the one listing SupportsEagle3.",
    )
    bases: list[str] = Field(default_factory=list)
    methods: list[str] = Field(default_factory=list)
    forwards_aux_hidden_state_layers: bool = Field(
        default=False,
        description="set_aux_hidden_state_layers defined in the class or an in-file base.",
    )


class Eagle3Allowlist(BaseModel):
    """The config-time allowlist of ``config/speculative.py`` (vLLM 0.10.2-0.20).

    ``present`` false means no allowlist was found (vLLM 0.25+ dropped it): nothing is
    refused at config time. ``admits`` maps each model type of ALLOWLIST_MODEL_TYPES to
    whether vLLM's substring test lets it through.
    """

    present: bool
    file: str | None = None
    name: str | None = None
    line: int | None = None
    entries: list[str] | None = None
    admits: dict[str, bool] = Field(default_factory=dict)
    deepseek: bool = False
    kimi: bool = False


class VllmFile(BaseModel):
    """A file of the installed vLLM that the EAGLE-3 judgement reads."""

    sha256: str | None = None
    size: int | None = None
    missing: bool = False


class VllmFacts(BaseModel):
    installed: bool = False
    version: str | None = None
    path: str | None = None
    version_source: str | None = None
    eagle3: dict[str, bool | None] = Field(
        default_factory=dict,
        description="Class name -> EAGLE-3 supported; null when the class does not exist.",
    )
    eagle3_classes: dict[str, Eagle3ClassInfo] = Field(default_factory=dict)
    eagle3_allowlist: Eagle3Allowlist | None = None
    files: dict[str, VllmFile] = Field(
        default_factory=dict,
        description="Relative path -> sha256 and size (deepseek_v2.py, kimi_k25.py, the "
        "allowlist's file), as the host hashed them.",
    )


class Supervisors(BaseModel):
    systemd: bool = False
    """systemd is PID 1 (and /run/systemd/system exists)."""
    pid1: str | None = None
    systemctl: str | None = None
    supervisord: str | None = None
    supervisorctl: str | None = None
    available: list[str] = Field(default_factory=list)
    """Usable backends, best first: "systemd", "supervisord"."""


class VllmServer(BaseModel):
    pid: int
    argv: list[str]
    model: str | None = None
    port: int | None = None
    host: str | None = None
    uid: int | None = None
    descendants: list[str] = Field(default_factory=list)
    """Command lines (first word) of its vLLM child processes, e.g. "VLLM::EngineCore"."""


class DiskUsage(BaseModel):
    path: str
    total_bytes: int
    used_bytes: int
    free_bytes: int


class HostFacts(BaseModel):
    hostname: str | None = None
    python: str | None = None
    python_executable: str | None = None
    vllm: VllmFacts = Field(default_factory=VllmFacts)
    gpus: list[GpuInfo] = Field(default_factory=list)
    driver: str | None = None
    nvidia_smi: str = "missing"
    """"ok", "missing" (not on PATH: no GPUs, not an error) or "failed"."""
    supervisors: Supervisors = Field(default_factory=Supervisors)
    servers: list[VllmServer] = Field(default_factory=list)
    disk: dict[str, DiskUsage] = Field(default_factory=dict)
    """"home" and "vllm" (the filesystem holding the vLLM package)."""
    errors: dict[str, str] = Field(default_factory=dict)
    """Parts of the facts script that failed on the host, with their error."""

"""Pydantic models: the rule catalogue (data, validated at load) and diagnosis results.

The catalogue is YAML shipped in the package (``catalogue.yaml``); :mod:`fleet.diagnosis.catalogue`
loads it into :class:`Catalogue`, which compiles and checks every regex, so a bad pattern fails
a unit test instead of a user's run.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Severity = Literal["fatal", "error", "warning"]
Role = Literal["cause", "symptom", "wrapper"]
Confidence = Literal["high", "medium", "low"]

SEVERITY_ORDER: dict[str, int] = {"fatal": 0, "error": 1, "warning": 2}

# The stable ids of docs/taxonomy.md. Every id has a catalogue entry.
TAXONOMY: tuple[str, ...] = (
    # speculative decoding
    "eagle3-unsupported-model",
    "eagle3-target-not-allowlisted",
    "spec-config-invalid",
    "drafter-incompatible",
    # memory
    "cuda-oom",
    "kv-cache-too-small",
    "kv-cache-no-memory",
    "gpu-memory-utilization-too-high",
    "memory-profiling-failed",
    "max-model-len-too-large",
    # parallelism
    "tp-size-invalid",
    "pp-layer-mapping-error",
    "nccl-error",
    "nccl-timeout",
    "shm-too-small",
    "worker-hang",
    "worker-died",
    "ray-actor-died",
    # environment
    "cuda-driver-mismatch",
    "cuda-arch-unsupported",
    "cuda-reinit-in-fork",
    "no-gpu-visible",
    "install-abi-mismatch",
    "torch-compile-failed",
    "attention-backend-unsupported",
    "quantization-unsupported",
    # serving features (issue 24)
    "cli-args-invalid",
    "tool-call-parser-error",
    "chat-template-render-failed",
    "lora-limit-exceeded",
    "sampling-nan",
    # model and config
    "architecture-unsupported",
    "architecture-inspection-failed",
    "trust-remote-code-required",
    "chat-template-missing",
    "hf-auth-failed",
    "model-not-found",
    "checkpoint-corrupt",
    "checkpoint-weight-mismatch",
    "disk-full",
    # multi-node
    "node-mismatch",
    "multinode-unsupported",
    "node-unreachable",
    "network-interface-wrong",
    "node-ip-duplicate",
    "node-join-timeout",
    # server
    "port-in-use",
    "engine-dead",
    "engine-init-failed",
    # fleet
    "load-stalled",
    "load-timeout",
    "process-exited",
    "supervisor-died",
    "patch-not-applied",
    "unrecognized-error",
)

# The ids fleet reports from what it observes itself (its stall and time-out watch, the
# supervisor, the preflight and the group preflight, built by fleet.diagnosis.factory): no
# line a vLLM log holds says them, so their catalogue entries have texts and no patterns.
OBSERVED_BY_FLEET: frozenset[str] = frozenset({
    "load-stalled", "supervisor-died", "patch-not-applied", "node-mismatch",
    "multinode-unsupported", "node-unreachable",
})  # fmt: skip

# Rank of a rule's role: a specific cause first, then symptoms that usually follow a cause
# (a worker or the engine died), then an exception no rule explains (``unrecognized-error``),
# then the generic wrappers ("Engine core initialization failed. See root cause above").
ROLE_TIER: dict[str, int] = {"cause": 0, "symptom": 1, "unrecognized": 2, "wrapper": 3}


def _compile(pattern: str, what: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{what}: invalid regex {pattern!r}: {exc}") from None


class ContextSpec(BaseModel):
    """A pattern only counts when ``regex`` matched one of the ``within`` lines before it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    regex: str
    within: int = Field(default=60, ge=1, le=400)

    @field_validator("regex")
    @classmethod
    def _valid(cls, value: str) -> str:
        _compile(value, "context")
        return value


class PatternSpec(BaseModel):
    """One signature of a rule: a regex anchored to a real message string."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    regex: str
    source: str = Field(min_length=3, description="where the message comes from (vLLM file...)")
    specificity: int | None = Field(default=None, ge=0, le=100)
    severity: Severity | None = None
    role: Role | None = None
    info: bool = Field(default=False, description="also match vLLM INFO/DEBUG lines")
    context: ContextSpec | None = None
    example: str | None = Field(
        default=None, description="a real message the regex must match (checked at load)"
    )
    confidence: Confidence | None = Field(
        default=None, description="override: a generic signature of the cause (medium)"
    )

    @field_validator("regex")
    @classmethod
    def _valid(cls, value: str) -> str:
        _compile(value, "pattern")
        return value

    @model_validator(mode="after")
    def _example_matches(self) -> PatternSpec:
        if self.example is not None and not re.search(self.regex, self.example):
            raise ValueError(f"pattern {self.regex!r} does not match its example {self.example!r}")
        return self


class FrameSpec(BaseModel):
    """A traceback frame that points at a cause when the exception line itself is missing.

    ``file`` is searched in the frame's path, ``function`` must equal the frame's function
    (a regex, full match) and ``code``, when given, is searched in the source line shown
    under the frame (the call or ``raise`` that failed). Matches have medium confidence
    (``low`` for broad frames: any frame of Ray or of torch's compiler).

    A frame rule is tried on a traceback cut before its exception line; with
    ``with_exception: true`` also on a traceback whose exception line no rule explains
    (a bare ``TimeoutError`` raised in shm_broadcast.py, a ``KeyError`` in a model's
    ``load_weights``): the frame, not the message, names the cause."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str
    function: str
    code: str | None = None
    source: str = Field(min_length=3)
    confidence: Literal["medium", "low"] = "medium"
    with_exception: bool = False

    @field_validator("file", "function", "code")
    @classmethod
    def _valid(cls, value: str | None) -> str | None:
        if value is not None:
            _compile(value, "frame")
        return value


class Rule(BaseModel):
    """A catalogue entry: one taxonomy id, its signatures and what to tell the user."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    title: str
    severity: Severity
    role: Role = "cause"
    specificity: int = Field(default=50, ge=0, le=100)
    patterns: list[PatternSpec] = Field(default_factory=list)
    summary: list[str] = Field(min_length=1, description="templates; the first whose fields exist")
    root_cause: str
    remedy: str
    fix: list[str] = Field(default_factory=list, description="templates; none fitting -> null")
    derive: list[str] = Field(default_factory=list, description="named value derivations")
    explains: list[str] = Field(
        default_factory=list,
        description="ids this cause produces as a consequence: it ranks above them wherever",
    )
    frames: list[FrameSpec] = Field(
        default_factory=list, description="frames of a truncated traceback that point here"
    )

    @field_validator("id")
    @classmethod
    def _known_id(cls, value: str) -> str:
        if value not in TAXONOMY:
            raise ValueError(f"unknown taxonomy id {value!r}")
        return value


class Fact(BaseModel):
    """A value taken from anywhere in the log (e.g. the serving port from the args line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    regex: str
    source: str

    @model_validator(mode="after")
    def _one_group(self) -> Fact:
        pat = _compile(self.regex, f"fact {self.name}")
        if self.name not in pat.groupindex:
            raise ValueError(f"fact {self.name}: regex needs a (?P<{self.name}>...) group")
        return self


class _LinePattern(BaseModel):
    """A regex over log lines and where in vLLM (or which report) the line comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ClassVar[str] = "pattern"

    regex: str
    source: str

    @field_validator("regex")
    @classmethod
    def _valid(cls, value: str) -> str:
        _compile(value, cls.kind)
        return value


class Benign(_LinePattern):
    """Lines that look like errors but are not a server failure (request-level errors...)."""

    kind: ClassVar[str] = "benign"


class Signal(_LinePattern):
    """A line that means "not clean" even when no rule explains it (a fatal marker...)."""

    kind: ClassVar[str] = "signal"


class Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int
    gates: list[str] = Field(min_length=1)
    info_gates: list[str] = Field(default_factory=list)
    exception_line: str
    fatal_markers: list[Signal] = Field(default_factory=list)
    benign: list[Benign] = Field(default_factory=list)
    facts: list[Fact] = Field(default_factory=list)
    rules: list[Rule]

    @model_validator(mode="after")
    def _complete(self) -> Catalogue:
        for rule in self.rules:
            unknown = [i for i in rule.explains if i not in TAXONOMY or i == rule.id]
            if unknown:
                raise ValueError(f"rule {rule.id}: explains unknown ids {unknown}")
        ids = [rule.id for rule in self.rules]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate rule ids: {dupes}")
        missing = [i for i in TAXONOMY if i not in ids]
        if missing:
            raise ValueError(f"taxonomy ids without a catalogue entry: {missing}")
        _compile(self.exception_line, "exception_line")
        return self

    def rule(self, rule_id: str) -> Rule:
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        raise KeyError(rule_id)


# --------------------------------------------------------------------------- results


class Evidence(BaseModel):
    """A log line (1-based number in the original log) that supports a diagnosis."""

    line: int
    text: str


class Diagnosis(BaseModel):
    """One finding. ``fleet logs --diagnose --json`` emits a ranked list of these."""

    id: str
    severity: Severity
    title: str
    summary: str
    root_cause: str
    remedy: str
    fix: str | None = None
    evidence: list[Evidence]
    context: list[Evidence] = Field(
        default_factory=list, description="lines around the first evidence line"
    )
    count: int = Field(default=1, description="how many matching lines (evidence is capped)")
    values: dict[str, str] = Field(default_factory=dict, description="captured values")
    role: str = "cause"
    specificity: int = 0
    confidence: Confidence = Field(
        default="high",
        description="high: the root message itself; medium: a frame, a raise-line literal, "
        "a symptom or a generic signature; low: a generic wrapper or an unrecognised error",
    )

    @property
    def is_problem(self) -> bool:
        """fatal or error: what makes ``fleet logs --diagnose`` exit 1."""
        return self.severity in ("fatal", "error")

    def as_contract(self) -> dict[str, object]:
        """The JSON shape of docs/contracts.md (plus a few extra fields)."""
        return {
            "id": self.id,
            "severity": self.severity,
            "summary": self.summary,
            "evidence": [e.model_dump() for e in self.evidence],
            "remedy": self.remedy,
            "fix": self.fix,
            "confidence": self.confidence,
            "title": self.title,
            "root_cause": self.root_cause,
            "count": self.count,
            "values": self.values,
            "context": [e.model_dump() for e in self.context],
        }

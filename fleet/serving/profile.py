"""Serve profiles: ``playbooks/<name>.yaml``, Jinja2-rendered per host, pydantic-validated.

A profile says what to serve and how (target and drafter, parallel sizes, the speculative
config, port, budgets, supervisor). Every string in it is a Jinja2 template rendered with
the host's inventory variables (``{{ models_dir }}/Kimi-K2.5``), so one profile serves a
fleet whose hosts differ (expressions and ``{% if %}`` only, rendered in bounded time and
size: see ``_check_template``); the rendered profile is then validated (unknown keys refused,
only the speculative-config keys vLLM accepts). Profiles are found in ``./playbooks/``
first, then in the installed package. Pure apart from reading the profile file and the
secrets' env file.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleet.errors import UsageError
from fleet.onhost.layout import PROFILE_NAME_RULE, profile_name_ok
from fleet.paths import playbooks_dir

if TYPE_CHECKING:
    from fleet.serving.multinode import Node

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_PROFILE_BYTES = 256 * 1024


class ProfileError(UsageError):
    """A profile refused (exit 2): its message on one line whatever the profile's keys and
    values hold (control characters escaped, long messages cut)."""

    code = "profile-invalid"

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None) -> None:
        text = "".join(
            c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in message
        )
        super().__init__(text if len(text) <= 1000 else text[:997] + "...", hint=hint, code=code)


# a line break or another control character in a value would start a new line in the
# launch script, the supervisord program or the systemd unit (ExecStartPre=...)
_CONTROL = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _one_line(cls, value: Any) -> Any:
        if isinstance(value, str) and _CONTROL.search(value):
            raise ValueError("a control character (newline, tab, escape...) is not allowed")
        return value


class SpeculativeConfig(_Model):
    """``--speculative-config`` (only keys vLLM's SpeculativeConfig accepts)."""

    method: Literal["eagle3", "eagle", "mtp"] = "eagle3"
    model: str = Field(min_length=1, description="The drafter: a local path or a hub id.")
    num_speculative_tokens: int = Field(ge=1, le=16)
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)


class Secrets(_Model):
    """Secrets by reference: an env file on the CONTROL machine (``KEY=value`` lines),
    pushed to the host with mode 0600 and read by the server's launch script. Never on a
    command line, in a log or in JSON."""

    env_file: str = Field(description="Path on the control machine, e.g. ~/.config/fleet/kimi.env")
    required: list[str] = Field(default_factory=list, description="Keys that must be set.")


class Profile(_Model):
    """A serve profile, rendered for one host."""

    name: str
    description: str = ""
    model: str = Field(min_length=1, description="The target model: a local path or a hub id.")
    served_model_name: str = Field(min_length=1)
    tensor_parallel_size: int = Field(ge=1, le=64)
    speculative: SpeculativeConfig | None = Field(
        default=None,
        description="The drafter and --speculative-config; none: a plain server (e.g. the "
        "baseline of `fleet bench`).",
    )
    port: int = Field(default=8000, ge=1, le=65535)
    host: str = Field(default="0.0.0.0", description="vLLM's --host (the address it binds).")
    max_model_len: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    trust_remote_code: bool = False
    extra_args: list[str] = Field(default_factory=list, description="More `vllm serve` args.")
    env: dict[str, str] = Field(default_factory=dict, description="Server environment.")
    secrets: Secrets | None = None
    requires_patch: str | None = Field(
        default=None, description="A patch set the host must have (fleet patch --patch NAME)."
    )
    vllm: str | None = Field(
        default=None,
        description="The vllm executable on the host [default: `vllm` beside the host's python].",
    )
    load_timeout_s: float = Field(default=3600.0, gt=0, description="Budget for the whole load.")
    stall_timeout_s: float = Field(
        default=600.0, gt=0, description="No new output and no progress for this long: stalled."
    )
    supervisor: Literal["auto", "supervisord", "systemd"] = "auto"
    restart: Literal["never", "on-failure"] = Field(
        default="never",
        description="on-failure: restart after a crash once the server was up (vLLM exits 0 "
        "when its engine dies after start-up, so exit 0 counts as a failure too).",
    )
    stop_grace_s: float = Field(default=30.0, gt=0, le=600)
    # -- one model across several hosts (fleet.serving.multinode)
    nodes: int = Field(default=1, ge=1, le=64, description="Hosts one server spans.")
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    distributed_backend: Literal["mp", "ray"] | None = Field(
        default=None,
        description="vLLM's --distributed-executor-backend across nodes: mp (vLLM's own "
        "multi-node, 0.11.1+: --nnodes/--node-rank/--headless) or ray (a Ray cluster fleet "
        "starts on the nodes). Required when nodes > 1.",
    )
    master_port: int = Field(default=29501, ge=1, le=65535, description="mp: torch's rendezvous.")
    ray_port: int = Field(default=6379, ge=1, le=65535, description="ray: the head's GCS port.")
    vllm_port_base: int | None = Field(
        default=None,
        ge=1024,
        le=65000,
        description="VLLM_PORT on every node: the head's extra sockets from this port on "
        "(a range the firewall allows), instead of random ports.",
    )
    node_interface: str | None = Field(
        default=None,
        description="The network interface nodes talk over: GLOO_SOCKET_IFNAME and "
        "NCCL_SOCKET_IFNAME on every node.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not profile_name_ok(value):
            raise ValueError(PROFILE_NAME_RULE)
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if "\0" in item or "\n" in item:
                raise ValueError(f"{key}: a value may not hold a NUL or a newline")
        return value

    @field_validator("extra_args", mode="before")
    @classmethod
    def _extra_words(cls, value: Any) -> Any:
        """A string is split as a shell splits a command line (so one inventory variable
        can carry several arguments: ``extra_args: "{{ vllm_extra_args | default('') }}"``)."""
        if isinstance(value, str):
            from fleet.transport.shell import words

            try:
                return words(value)
            except ValueError as exc:
                raise ValueError(f"cannot split {value!r} into arguments: {exc}") from None
        return value

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for arg in value:
            if "\0" in arg or "\n" in arg:
                raise ValueError("an argument may not hold a NUL or a newline")
            if arg.split("=", 1)[0] in ("--api-key",):
                raise ValueError("--api-key belongs in the secrets env file (VLLM_API_KEY)")
        return value

    @model_validator(mode="after")
    def _parallel(self) -> Profile:
        if self.nodes > 1 and self.distributed_backend is None:
            raise ValueError(
                "nodes > 1 needs distributed_backend: mp or ray (vLLM 0.11.1+ no longer "
                "picks Ray by itself)"
            )
        if self.world_size % self.nodes:
            raise ValueError(
                f"tensor_parallel_size x pipeline_parallel_size ({self.world_size}) must "
                f"split evenly over {self.nodes} nodes"
            )
        if self.node_interface is not None and not re.fullmatch(
            r"[\w.:-]{1,15}", self.node_interface
        ):
            raise ValueError(f"node_interface {self.node_interface!r} is not an interface name")
        return self

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus_per_node(self) -> int:
        return self.world_size // self.nodes

    def vllm_executable(self, python: str) -> str:
        """``vllm`` beside the host's python, unless the profile names one."""
        if self.vllm:
            return self.vllm
        parent = python.rsplit("/", 1)[0] if "/" in python else ""
        return f"{parent}/vllm" if parent else "vllm"

    def speculative_json(self) -> str | None:
        import json

        if self.speculative is None:
            return None
        return json.dumps(self.speculative.model_dump(exclude_none=True), separators=(",", ":"))

    def fingerprint(self) -> str:
        """sha256 of what this profile serves, rendered for its host (every field; the
        secrets by reference only: their file and required keys, never a value). The launch
        records it on the host, so ``fleet rollout`` can tell a server of this profile as
        it is now from one started from an earlier version of it."""
        import hashlib
        import json

        doc = self.model_dump(mode="json")
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def without_drafter(self) -> Profile:
        """The same server without speculative decoding (``fleet bench``'s baseline)."""
        return self.model_copy(update={"speculative": None})

    def vllm_args(self, node: Node | None = None) -> list[str]:
        """``vllm serve`` arguments, as vLLM's argparse reads them (``node``: this host's
        part of a server across several hosts)."""
        args = [
            self.model,
            "--served-model-name",
            self.served_model_name,
            "--tensor-parallel-size",
            str(self.tensor_parallel_size),
        ]
        spec = self.speculative_json()
        if spec is not None:
            args += ["--speculative-config", spec]
        args += [
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--gpu-memory-utilization",
            f"{self.gpu_memory_utilization:g}",
        ]
        if self.max_model_len is not None:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.trust_remote_code:
            args.append("--trust-remote-code")
        if self.pipeline_parallel_size > 1:
            args += ["--pipeline-parallel-size", str(self.pipeline_parallel_size)]
        if node is not None:
            args += node.vllm_args(self)
        return [*args, *self.extra_args]


def schema() -> dict[str, Any]:
    """The JSON Schema of serve profiles (``fleet profile schema``), for editors."""
    doc = Profile.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "fleet serve profile"
    doc["description"] = (
        "playbooks/<name>.yaml; every string is a Jinja2 template rendered with the host's "
        "inventory variables (e.g. '{{ models_dir }}/Kimi-K2.5')."
    )
    return doc


# -- finding, reading, rendering ----------------------------------------------------------


def profile_path(name: str, search: list[Path] | None = None) -> Path:
    """``./playbooks/NAME.yaml``, else the installed package's."""
    if not profile_name_ok(name):
        raise ProfileError(f"invalid profile name {name!r}")
    dirs = search if search is not None else [Path.cwd() / "playbooks", playbooks_dir()]
    for directory in dirs:
        candidate = directory / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.yaml")})
    raise ProfileError(
        f"no serve profile {name!r} (in {', '.join(str(d) for d in dirs)})"
        + (f"; known: {', '.join(known)}" if known else "")
    )


@cache
def _raw(path: Path) -> dict[str, Any]:
    from fleet.safeyaml import InputFileError, load_yaml_file

    try:
        data = load_yaml_file(path, max_bytes=MAX_PROFILE_BYTES, what="serve profile")
    except InputFileError as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a serve profile must be a mapping")
    return data


def load_raw(name: str) -> tuple[Path, dict[str, Any]]:
    path = profile_path(name)
    return path, _raw(path)


# A profile value is data with {{ expressions }} (and {% if %}), rendered once per host:
# names, constants, lookups, ~ and arithmetic, tests and a few filters that never grow a
# value. No loops, {% set %}, macros or calls (range(), lipsum(), str methods), no text
# repeated (*) or %-formatted: the rendered size is bounded by the template's and the
# variables' sizes, and rendering is linear in them.
MAX_RENDERED = 64 * 1024  # characters of one rendered value


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


FILTERS = _words(
    "default d lower upper trim title capitalize string int float abs round length first last"
)
_NODES = _words(
    "Template Output TemplateData Const Name Getattr Getitem Slice Filter Test Concat "
    "CondExpr Compare Operand And Or Not Neg Pos Add Sub Div FloorDiv Mod Mul Pow If "
    "List Tuple Dict Pair Keyword"
)

_REFUSED = {
    "For": "loops",
    "Call": "calls",
    "Macro": "macros",
    "CallBlock": "macros",
    "Assign": "{% set %} statements",
    "AssignBlock": "{% set %} statements",
    "Include": "includes",
    "Import": "imports",
    "FromImport": "imports",
    "Extends": "extends",
}


def _check_template(tree: Any, where: str) -> None:
    """Refuse what a profile value may not use (iteratively: a deep tree is no problem)."""
    from jinja2 import nodes

    stack = [tree]
    while stack:
        node = stack.pop()
        kind = type(node).__name__
        if kind not in _NODES:
            what = _REFUSED.get(kind, f"{kind} nodes")
            raise ProfileError(f"{where}: {what} are not allowed in a profile value")
        if isinstance(node, nodes.Filter) and node.name not in FILTERS:
            raise ProfileError(f"{where}: the filter {node.name!r} is not allowed here")
        stack.extend(node.iter_child_nodes())


@cache
def _environment() -> Any:
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    class ProfileEnvironment(SandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            sized = (str, list, tuple, dict)
            if operator in ("*", "%") and (isinstance(left, sized) or isinstance(right, sized)):
                raise ValueError(f"{operator!r} on text or lists is not allowed in a profile")
            ints = isinstance(left, int) and isinstance(right, int)
            if operator == "**" and ints and max(abs(left), 2).bit_length() * right > 4096:
                raise ValueError("a power over 4096 bits")
            return super().call_binop(context, operator, left, right)

    return ProfileEnvironment(undefined=StrictUndefined, autoescape=False)


def _render_value(value: Any, context: dict[str, Any], where: str, env: Any) -> Any:
    from jinja2 import TemplateError

    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return value
        try:
            tree = env.parse(value)
            _check_template(tree, where)
            out = env.from_string(tree).render(context)
        except ProfileError:
            raise
        except TemplateError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        except Exception as exc:  # OverflowError, RecursionError...: bad input, one line
            raise ProfileError(f"{where}: {type(exc).__name__}: {exc}"[:500]) from None
        if len(out) > MAX_RENDERED:
            raise ProfileError(f"{where}: renders to more than {MAX_RENDERED} characters")
        return out
    if isinstance(value, dict):
        return {k: _render_value(v, context, f"{where}.{k}", env) for k, v in value.items()}
    if isinstance(value, list):
        return [_render_value(v, context, f"{where}[{i}]", env) for i, v in enumerate(value)]
    return value


def render(raw: dict[str, Any], context: dict[str, Any], *, label: str = "profile") -> Profile:
    """A raw profile rendered with ``context`` (the host's variables) and validated."""
    rendered = _render_value(raw, context, label, _environment())
    try:
        return Profile.model_validate(rendered)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top)"
        raise ProfileError(f"{label}: {loc}: {err['msg']}") from None


def host_context(host: Any) -> dict[str, Any]:
    """The variables a profile sees for a host: its inventory fields and free vars."""
    context: dict[str, Any] = {
        k: v for k, v in host.model_dump().items() if k not in ("vars",) and v is not None
    }
    context["host"] = host.name
    context.update(getattr(host, "vars", None) or {})
    return context


def for_host(name: str, host: Any) -> Profile:
    path, raw = load_raw(name)
    return render(raw, host_context(host), label=f"{path.name} for {host.name}")


def read_secrets(profile: Profile) -> dict[str, str]:
    """The secrets env file of the control machine: ``KEY=value`` lines (``#`` comments,
    optional ``export``, optional quotes). Values are never printed."""
    from fleet.safeyaml import InputFileError, read_regular

    if profile.secrets is None:
        return {}
    try:
        path = Path(profile.secrets.env_file).expanduser()
        text = read_regular(path, max_bytes=64 * 1024, what="secrets env file").decode("utf-8")
    except (InputFileError, RuntimeError) as exc:
        raise ProfileError(str(exc)) from None
    except UnicodeDecodeError:
        raise ProfileError(f"secrets env file {path} is not UTF-8 text") from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _ENV_NAME.match(key):
            raise ProfileError(f"{path}:{n}: not a KEY=value line")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if "\0" in value:
            raise ProfileError(f"{path}:{n}: a value may not hold a NUL")
        out[key] = value
    missing = [k for k in profile.secrets.required if not out.get(k)]
    if missing:
        raise ProfileError(f"{path}: missing {', '.join(missing)}")
    return out

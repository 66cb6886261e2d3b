"""Preflight: the failures that can be known before a 40-minute load, as diagnoses (pure).

The host answers one round trip of observations (``fleet/onhost/serve.py``
``op_preflight``, typed in :mod:`fleet.serving.observed`); :func:`judge` runs every rule
of :data:`RULES` over them, in order, most fundamental first. A rule is a small function
``rule(seen: Seen) -> list[Diagnosis]`` that reads the typed observations and builds its
findings with :func:`fleet.diagnosis.factory.diagnosis` (the taxonomy id's catalogue entry,
with what was observed as the evidence, and the fix fleet can run). The rules: GPU count
and free memory against the parallel sizes, the draft TP size, model and drafter files,
EAGLE-3 support of the target class and the config-time allowlist as the installed source
says (``eagle3-unsupported-model`` / ``eagle3-target-not-allowlisted``, fix ``fleet patch
--host H``), attention heads against TP, the max model length, drafter/target
compatibility from both ``config.json`` files, the port (a plain bind), the executable,
disk. To add one: CONTRIBUTING.md, "add a preflight rule".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from fleet.diagnosis.factory import diagnosis
from fleet.diagnosis.models import Diagnosis
from fleet.facts.parsers import find_eagle3_class, parse_allowlist, parse_gpu_part
from fleet.serving.observed import ModelDir, PreflightAnswer
from fleet.serving.profile import Profile
from fleet.sizes import MiB, in_unit

if TYPE_CHECKING:
    from fleet.facts.models import GpuInfo
    from fleet.patching.apply import HostReport

MIB = 1024 * 1024
GIB = 1024 * MIB
MIN_FREE_DISK = 2 * GIB
# model types transformers itself can load (the rest need vLLM's own config registry)
TRANSFORMERS_TYPES = frozenset(
    {"llama", "qwen2", "qwen3", "mistral", "deepseek_v2", "deepseek_v3", "mixtral", "gemma"}
)


@dataclass
class Preflight:
    """One host's preflight: the diagnoses (empty: go), and what was seen."""

    host: str
    diagnoses: list[Diagnosis] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    vllm_version: str | None = None
    gpus: int = 0
    home: str | None = None

    @property
    def ok(self) -> bool:
        return not any(d.is_problem for d in self.diagnoses)


@dataclass
class Seen:
    """What the rules read: the profile, the host's typed observations, and the parts
    derived from them once (the GPUs, both config.json objects)."""

    profile: Profile
    answer: PreflightAnswer
    host: str
    notes: list[str] = field(default_factory=list)

    def found(self, rule_id: str, evidence: list[str], **values: Any) -> Diagnosis:
        return diagnosis(rule_id, host=self.host, evidence=evidence, seen_by="preflight", **values)

    @cached_property
    def gpu_part(self) -> tuple[list[GpuInfo], str, str | None]:
        return parse_gpu_part(self.answer.gpus)

    @property
    def gpus(self) -> list[GpuInfo]:
        return self.gpu_part[0]

    @property
    def target(self) -> dict[str, Any] | None:
        return self.answer.target.config_value

    @property
    def drafter(self) -> dict[str, Any] | None:
        return self.answer.drafter.config_value

    @property
    def target_text(self) -> dict[str, Any]:
        return _text_config(self.target or {})

    @property
    def vllm_version(self) -> str | None:
        return self.answer.vllm.version


PreflightRule = Callable[[Seen], list[Diagnosis]]


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _first_arch(config: dict[str, Any]) -> str | None:
    archs = config.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


# -- the rules, most fundamental first -----------------------------------------------------


def gpus_fit(seen: Seen) -> list[Diagnosis]:
    """GPUs visible, as many as this host's ranks (tp x pp, or its share over several
    nodes), each with the free memory the profile's gpu_memory_utilization asks for."""
    gpus, status, error = seen.gpu_part
    profile = seen.profile
    tp = profile.tensor_parallel_size
    need = profile.gpus_per_node
    if not gpus:
        why = "nvidia-smi is not installed" if status == "missing" else (error or "no GPU")
        return [seen.found("no-gpu-visible", [why], gpus=0, tp=tp)]
    if len(gpus) < need:
        sizes = f"--tensor-parallel-size {tp}"
        if profile.pipeline_parallel_size > 1 or profile.nodes > 1:
            sizes += (f" x --pipeline-parallel-size {profile.pipeline_parallel_size}"
                      f" over {profile.nodes} node(s)")  # fmt: skip
        return [
            seen.found(
                "tp-size-invalid", [f"{len(gpus)} GPUs visible, {sizes}"],
                tp=tp, gpus=len(gpus),
                message=f"{sizes} needs {need} GPUs on this host, it has {len(gpus)}",
            )
        ]  # fmt: skip
    util = seen.profile.gpu_memory_utilization
    for gpu in gpus[:need]:
        total = gpu.memory_total_mib or 0
        used = gpu.memory_used_mib or 0
        free = total - used
        if total > 0 and free < util * total:
            return [
                seen.found(
                    "gpu-memory-utilization-too-high",
                    [f"GPU {gpu.index}: {used} of {total} MiB in use"],
                    device=f"cuda:{gpu.index}", free=in_unit(free * MiB, "GiB"),
                    total=in_unit(total * MiB, "GiB"), util=f"{util:g}",
                    requested=in_unit(util * total * MiB, "GiB"),
                )
            ]  # fmt: skip
    return []


def draft_tp(seen: Seen) -> list[Diagnosis]:
    if seen.profile.speculative is None:
        return []
    draft = seen.profile.speculative.draft_tensor_parallel_size
    tp = seen.profile.tensor_parallel_size
    if draft is None or draft in (1, tp):
        return []
    return [
        seen.found(
            "spec-config-invalid",
            [f"draft_tensor_parallel_size {draft}, tensor_parallel_size {tp}"],
            message=f"draft_tensor_parallel_size={draft} must be 1 or {tp}",
        )
    ]  # fmt: skip


def _model_files(seen: Seen, key: str, entry: ModelDir, path: str) -> list[Diagnosis]:
    if entry.hub_id:
        seen.notes.append(f"{key} {path} is a hub id: vLLM downloads it (not checked here)")
        return []
    if not entry.exists:
        return [seen.found("model-not-found", [f"{key} directory {path} does not exist"],
                           model=path)]  # fmt: skip
    problem = entry.config.problem()
    if problem is not None:
        return [seen.found("checkpoint-corrupt", [f"{path}/config.json: {problem}"],
                           detail=f"{path}/config.json is {problem}")]  # fmt: skip
    weights = entry.weights
    if not weights.missing and weights.present:
        return []
    if weights.missing:
        count = f"{len(weights.missing)} of {len(weights.indexed)}"
        what = f"{count} shards missing, e.g. {weights.missing[0]}"
        values = {"detail": f"{path}: {what}"}
    else:
        what, values = "no *.safetensors files", {"model": path}
    return [seen.found("checkpoint-corrupt", [f"{path}: {what}"], **values)]


def target_files(seen: Seen) -> list[Diagnosis]:
    return _model_files(seen, "target", seen.answer.target, seen.profile.model)


def drafter_files(seen: Seen) -> list[Diagnosis]:
    if seen.profile.speculative is None:
        return []
    return _model_files(seen, "drafter", seen.answer.drafter, seen.profile.speculative.model)


def eagle3_support(seen: Seen) -> list[Diagnosis]:
    """The target class must implement SupportsEagle3 (the runner checks the OUTER model)
    and its text model_type must pass the config-time allowlist (0.10-0.20)."""
    vllm, target, spec = seen.answer.vllm, seen.target, seen.profile.speculative
    if spec is None or spec.method != "eagle3" or not vllm.path or target is None:
        return []
    out: list[Diagnosis] = []
    model_type = seen.target_text.get("model_type")
    allow = parse_allowlist(vllm.allowlist)
    if allow.present and isinstance(model_type, str):
        from fleet.onhost.vllm_tree import admits

        if not admits(allow.entries, model_type):
            out.append(
                seen.found(
                    "eagle3-target-not-allowlisted",
                    [f"{allow.file}:{allow.line} {allow.name} = {allow.entries}",
                     f"target text model_type '{model_type}'"],
                    model_type=model_type, allowed=str(allow.entries),
                )
            )  # fmt: skip
    arch = _first_arch(target)
    info = find_eagle3_class(vllm.models.get("files") or {}, arch) if arch else None
    if info is not None and not info.supported:
        out.append(
            seen.found(
                "eagle3-unsupported-model",
                [f"{info.file}:{info.line} class {arch}({', '.join(info.bases)})"],
                model_class=arch,
            )
        )
    return out


def heads_divide_tp(seen: Seen) -> list[Diagnosis]:
    heads = _int(seen.target_text.get("num_attention_heads"))
    tp = seen.profile.tensor_parallel_size
    if seen.target is None or not heads or not tp or heads % tp == 0:
        return []
    return [
        seen.found(
            "tp-size-invalid", [f"num_attention_heads {heads}, --tensor-parallel-size {tp}"],
            heads=heads, tp=tp, gpus=len(seen.gpus),
        )
    ]  # fmt: skip


def max_model_len_fits(seen: Seen) -> list[Diagnosis]:
    limit = _int(seen.target_text.get("max_position_embeddings"))
    wanted = seen.profile.max_model_len
    if seen.target is None or not limit or not wanted or wanted <= limit:
        return []
    return [
        seen.found(
            "max-model-len-too-large",
            [f"max_position_embeddings {limit}, --max-model-len {wanted}"],
            max_len=wanted, key="max_position_embeddings", derived=limit,
        )
    ]  # fmt: skip


def drafter_fits(seen: Seen) -> list[Diagnosis]:
    """Architecture and config type known to the installed vLLM; hidden size, vocab and
    aux-layer ids that fit the target."""
    target, drafter = seen.target, seen.drafter
    if target is None or drafter is None or seen.profile.speculative is None:
        return []
    knows = seen.answer.vllm.knows
    text = seen.target_text
    version = seen.vllm_version
    problems: list[str] = []
    arch = _first_arch(drafter)
    if arch and knows and not knows.get(arch, False):
        problems.append(
            f"Model architectures ['{arch}'] are not supported for now by vLLM "
            f"{version} (its registry does not name it)"
        )
    model_type = drafter.get("model_type")
    if (
        isinstance(model_type, str)
        and knows
        and model_type not in TRANSFORMERS_TYPES
        and not knows.get(model_type, False)
        and "auto_map" not in drafter
    ):
        problems.append(
            f"model type '{model_type}' is not known to vLLM {version} "
            "(nor to transformers) and the drafter has no auto_map"
        )
    t_hidden = _int(text.get("hidden_size"))
    d_hidden = _int(drafter.get("target_hidden_size")) or _int(drafter.get("hidden_size"))
    if t_hidden and d_hidden and t_hidden != d_hidden:
        problems.append(f"drafter hidden size {d_hidden} != target hidden size {t_hidden}")
    t_vocab, d_vocab = _int(text.get("vocab_size")), _int(drafter.get("vocab_size"))
    if t_vocab and d_vocab and t_vocab != d_vocab:
        problems.append(f"drafter vocab_size {d_vocab} != target vocab_size {t_vocab}")
    draft_vocab = _int(drafter.get("draft_vocab_size"))
    if draft_vocab and t_vocab and draft_vocab > t_vocab:
        problems.append(f"draft_vocab_size {draft_vocab} > target vocab_size {t_vocab}")
    layers = _int(text.get("num_hidden_layers"))
    eagle = drafter.get("eagle_config")
    ids = drafter.get("eagle_aux_hidden_state_layer_ids")
    if ids is None and isinstance(eagle, dict):
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if layers and isinstance(ids, list):
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < layers]
        if bad:
            problems.append(f"aux layer ids {bad} are not below the target's {layers} layers")
    if not problems:
        return []
    return [seen.found("drafter-incompatible", problems, shapes="; ".join(problems),
                       drafter_arch=arch)]  # fmt: skip


def port_free(seen: Seen) -> list[Diagnosis]:
    port = seen.answer.port
    if port.free:
        return []
    evidence = [f"bind(:{seen.profile.port}): {port.error or 'in use'}"]
    if port.holder:
        evidence.append(f"held by {port.holder}")
    return [seen.found("port-in-use", evidence, port=seen.profile.port, holder=port.holder)]


def vllm_executable(seen: Seen) -> list[Diagnosis]:
    exe = seen.answer.vllm_executable
    if exe.path and not exe.ok:
        seen.notes.append(f"no vllm executable at {exe.path} (set the profile's 'vllm')")
    return []


def disk_free(seen: Seen) -> list[Diagnosis]:
    home = seen.answer.disk.home
    if home.free is None or home.free >= MIN_FREE_DISK:
        return []
    return [
        seen.found("disk-full", [f"{home.free / GIB:.1f} GiB free in {home.path}"], path=home.path)
    ]


RULES: tuple[PreflightRule, ...] = (
    gpus_fit,
    draft_tp,
    target_files,
    drafter_files,
    eagle3_support,
    heads_divide_tp,
    max_model_len_fits,
    drafter_fits,
    port_free,
    vllm_executable,
    disk_free,
)


def judge(
    profile: Profile, observed: PreflightAnswer | Mapping[str, Any], *, host: str
) -> Preflight:
    """The diagnoses of one host's observations: every rule of :data:`RULES`, in order."""
    answer = (
        observed
        if isinstance(observed, PreflightAnswer)
        else PreflightAnswer.model_validate(dict(observed))
    )
    seen = Seen(profile=profile, answer=answer, host=host)
    out = Preflight(host=host, home=answer.home, vllm_version=answer.vllm.version)
    for rule in RULES:
        out.diagnoses += rule(seen)
    out.gpus = len(seen.gpus)
    out.notes = seen.notes
    return out


def judge_patch(report: HostReport, *, host: str) -> list[Diagnosis]:
    """The profile's ``requires_patch`` against ``fleet patch --check`` on the host: applied
    or not needed is a go; a patch set that would still apply, or that conflicts, is a
    refusal with its fix."""
    from fleet.patching.manifest import DEFAULT_PATCH_SET

    status = report.status
    if status in ("already-applied", "not-needed"):
        return []
    pending = [f for f in report.files if f.status in ("would-apply", "conflict")]
    evidence = [f"{f.path}: {f.status}" + (f" ({f.note})" if f.note else "") for f in pending]
    option = "" if report.patch_set == DEFAULT_PATCH_SET else f" --patch {report.patch_set}"
    conflict = status == "conflict"
    return [
        diagnosis(
            "patch-not-applied", host=host, evidence=evidence or [status],
            seen_by="fleet patch --check",
            patch=report.patch_set, version=report.vllm_version,
            state="conflicts" if conflict else "is not applied",
            option=f"{option} --diff" if conflict else option,
        )
    ]  # fmt: skip

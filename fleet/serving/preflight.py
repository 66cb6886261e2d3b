"""Preflight: the failures that can be known before a 40-minute load, as diagnoses (pure).

The host answers one round trip of observations (``fleet/onhost/serve.py`` ``preflight``);
:func:`judge` turns them into diagnoses of the taxonomy (DESIGN.md) with the fix fleet can
run: GPU count and free memory against the parallel sizes, EAGLE-3 support of the target
class and the config-time allowlist as the installed source says (``eagle3-unsupported-
model`` / ``eagle3-target-not-allowlisted``, fix ``fleet patch --host H``), drafter/target
compatibility from both ``config.json`` files, model and drafter files, the port (a plain
bind), disk. Each finding cites what was observed as its evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.diagnosis.models import Diagnosis, Evidence
from fleet.facts.parsers import find_eagle3_class, parse_allowlist, parse_gpu_part
from fleet.serving.profile import Profile

if TYPE_CHECKING:
    from fleet.patching.service import HostReport

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
    running: dict[str, Any] | None = None
    home: str | None = None

    @property
    def ok(self) -> bool:
        return not any(d.is_problem for d in self.diagnoses)


def diagnosis(
    rule_id: str, host: str, evidence: list[str], *, seen_by: str = "preflight", **values: Any
) -> Diagnosis:
    """A diagnosis of ``rule_id`` rendered from the catalogue with ``values`` (the same
    summary, remedy and fix a crash log of that kind gets); ``evidence`` is what
    ``seen_by`` observed."""
    from fleet.diagnosis.catalogue import load_catalogue
    from fleet.diagnosis.engine import render

    rule = load_catalogue().rules[rule_id]
    vals = {k: str(v) for k, v in values.items() if v is not None}
    vals["host"] = host
    summary, fix, vals = render(rule, vals)
    return Diagnosis(
        id=rule.id,
        severity=rule.severity,
        title=rule.title,
        summary=summary,
        root_cause=rule.root_cause.strip(),
        remedy=rule.remedy.strip(),
        fix=fix,
        evidence=[Evidence(line=0, text=f"{seen_by}: {e}") for e in evidence],
        values=vals,
        role="cause",
        specificity=rule.specificity,
        confidence="high",
    )


def _config(observed: dict[str, Any], key: str) -> dict[str, Any] | None:
    entry = observed.get(key) or {}
    config = entry.get("config") if isinstance(entry, dict) else None
    value = config.get("value") if isinstance(config, dict) else None
    return value if isinstance(value, dict) else None


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def judge(profile: Profile, observed: dict[str, Any], *, host: str) -> Preflight:
    """The diagnoses of one host's observations, most fundamental first."""
    out = Preflight(host=host, home=observed.get("home"))
    found = out.diagnoses
    vllm = observed.get("vllm") or {}
    out.vllm_version = vllm.get("version")

    # -- GPUs: count and free memory against the parallel sizes
    gpus, status, error = parse_gpu_part(observed.get("gpus") or {})
    out.gpus = len(gpus)
    tp = profile.tensor_parallel_size
    if not gpus:
        why = "nvidia-smi is not installed" if status == "missing" else (error or "no GPU")
        found.append(diagnosis("no-gpu-visible", host, [why], gpus=0, tp=tp))
    elif len(gpus) < tp:
        found.append(
            diagnosis(
                "tp-size-invalid",
                host,
                [f"{len(gpus)} GPUs visible, --tensor-parallel-size {tp}"],
                tp=tp,
                gpus=len(gpus),
                message=f"tensor_parallel_size={tp} needs {tp} GPUs, the host has {len(gpus)}",
            )
        )
    else:
        for gpu in gpus[:tp]:
            total = gpu.memory_total_mib or 0
            used = gpu.memory_used_mib or 0
            if total <= 0:
                continue
            free = total - used
            if free < profile.gpu_memory_utilization * total:
                found.append(
                    diagnosis(
                        "gpu-memory-utilization-too-high",
                        host,
                        [f"GPU {gpu.index}: {used} of {total} MiB in use"],
                        device=f"cuda:{gpu.index}",
                        free=f"{free / 1024:.2f}",
                        total=f"{total / 1024:.2f}",
                        util=f"{profile.gpu_memory_utilization:g}",
                        requested=f"{profile.gpu_memory_utilization * total / 1024:.2f}",
                    )
                )
                break
    draft_tp = profile.speculative.draft_tensor_parallel_size
    if draft_tp is not None and draft_tp not in (1, tp):
        found.append(
            diagnosis(
                "spec-config-invalid",
                host,
                [f"draft_tensor_parallel_size {draft_tp}, tensor_parallel_size {tp}"],
                message=f"draft_tensor_parallel_size={draft_tp} must be 1 or {tp}",
            )
        )

    # -- vLLM, the target and what the installed source says about EAGLE-3
    target = _config(observed, "target")
    drafter = _config(observed, "drafter")
    _files(out, observed, "target", profile.model)
    _files(out, observed, "drafter", profile.speculative.model)
    if vllm.get("path") and target is not None:
        _eagle3(out, profile, vllm, target)
    if target is not None:
        text = _text_config(target)
        heads = _int(text.get("num_attention_heads"))
        if heads and tp and heads % tp:
            found.append(
                diagnosis(
                    "tp-size-invalid",
                    host,
                    [f"num_attention_heads {heads}, --tensor-parallel-size {tp}"],
                    heads=heads,
                    tp=tp,
                    gpus=len(gpus),
                )
            )
        limit = _int(text.get("max_position_embeddings"))
        if limit and profile.max_model_len and profile.max_model_len > limit:
            found.append(
                diagnosis(
                    "max-model-len-too-large",
                    host,
                    [f"max_position_embeddings {limit}, --max-model-len {profile.max_model_len}"],
                    max_len=profile.max_model_len,
                    key="max_position_embeddings",
                    derived=limit,
                )
            )
    if target is not None and drafter is not None:
        _drafter(out, vllm, target, drafter)

    # -- the port, the executable, disk, a server already there
    port = observed.get("port") or {}
    if port.get("free") is False:
        holder = port.get("holder")
        found.append(
            diagnosis(
                "port-in-use",
                host,
                [f"bind(:{profile.port}): {port.get('error') or 'in use'}"]
                + ([f"held by {holder}"] if holder else []),
                port=profile.port,
                holder=holder,
            )
        )
    exe = observed.get("vllm_executable") or {}
    if exe and not exe.get("ok"):
        out.notes.append(f"no vllm executable at {exe.get('path')} (set the profile's 'vllm')")
    home_disk = (observed.get("disk") or {}).get("home") or {}
    free_disk = _int(home_disk.get("free"))
    if free_disk is not None and free_disk < MIN_FREE_DISK:
        found.append(
            diagnosis(
                "disk-full",
                host,
                [f"{free_disk / GIB:.1f} GiB free in {home_disk.get('path')}"],
                path=home_disk.get("path"),
            )
        )
    out.running = observed.get("server")
    return out


def _files(out: Preflight, observed: dict[str, Any], key: str, path: str) -> None:
    entry = observed.get(key) or {}
    if entry.get("hub_id"):
        out.notes.append(f"{key} {path} is a hub id: vLLM downloads it (not checked here)")
        return
    if not entry.get("exists"):
        out.diagnoses.append(
            diagnosis(
                "checkpoint-corrupt",
                out.host,
                [f"{key} directory {path} does not exist"],
                detail=f"the {key} directory {path} does not exist",
            )
        )
        return
    config = entry.get("config") or {}
    if "value" not in config:
        problem = "missing" if config.get("missing") else config.get("error", "unreadable")
        out.diagnoses.append(
            diagnosis(
                "checkpoint-corrupt",
                out.host,
                [f"{path}/config.json: {problem}"],
                detail=f"{path}/config.json is {problem}",
            )
        )
        return
    weights = entry.get("weights") or {}
    missing = weights.get("missing") or []
    if missing or not (weights.get("present") or []):
        indexed = len(weights.get("indexed") or [])
        if missing:
            what = f"{len(missing)} of {indexed} shards missing, e.g. {missing[0]}"
            values = {"detail": f"{path}: {what}"}
        else:
            what, values = "no *.safetensors files", {"model": path}
        out.diagnoses.append(
            diagnosis("checkpoint-corrupt", out.host, [f"{path}: {what}"], **values)
        )


def _eagle3(out: Preflight, profile: Profile, vllm: dict[str, Any], target: dict[str, Any]) -> None:
    """The target class must implement SupportsEagle3 (the runner checks the OUTER model)
    and its text model_type must pass the config-time allowlist (0.10-0.20)."""
    if profile.speculative.method != "eagle3":
        return
    archs = target.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    files = (vllm.get("models") or {}).get("files") or {}
    model_type = _text_config(target).get("model_type")
    allow = parse_allowlist(vllm.get("allowlist") or {})
    if allow.present and isinstance(model_type, str):
        from fleet.onhost.vllm_tree import admits

        if not admits(allow.entries, model_type):
            out.diagnoses.append(
                diagnosis(
                    "eagle3-target-not-allowlisted",
                    out.host,
                    [
                        f"{allow.file}:{allow.line} {allow.name} = {allow.entries}",
                        f"target text model_type '{model_type}'",
                    ],
                    model_type=model_type,
                    allowed=str(allow.entries),
                )
            )
    if arch is None:
        return
    info = find_eagle3_class(files, arch)
    if info is not None and not info.supported:
        out.diagnoses.append(
            diagnosis(
                "eagle3-unsupported-model",
                out.host,
                [f"{info.file}:{info.line} class {arch}({', '.join(info.bases)})"],
                model_class=arch,
            )
        )


def _drafter(
    out: Preflight, vllm: dict[str, Any], target: dict[str, Any], drafter: dict[str, Any]
) -> None:
    """Architecture and config type known to the installed vLLM; hidden size, vocab and
    aux-layer ids that fit the target."""
    knows = vllm.get("knows") or {}
    text = _text_config(target)
    problems: list[str] = []
    archs = drafter.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch and knows and not knows.get(arch, False):
        problems.append(
            f"Model architectures ['{arch}'] are not supported for now by vLLM "
            f"{out.vllm_version} (its registry does not name it)"
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
            f"model type '{model_type}' is not known to vLLM {out.vllm_version} "
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
    if problems:
        out.diagnoses.append(
            diagnosis(
                "drafter-incompatible",
                out.host,
                problems,
                shapes="; ".join(problems),
                drafter_arch=arch,
            )
        )


def judge_patch(report: HostReport, *, host: str) -> list[Diagnosis]:
    """The profile's ``requires_patch`` against ``fleet patch --check`` on the host: applied
    or not needed is a go; a patch set that would still apply, or that conflicts, is a
    refusal with its fix."""
    status = report.status
    if status in ("already-applied", "not-needed"):
        return []
    pending = [f for f in report.files if f.status in ("would-apply", "conflict")]
    evidence = [f"{f.path}: {f.status}" + (f" ({f.note})" if f.note else "") for f in pending]
    from fleet.patching.manifest import DEFAULT_PATCH_SET

    option = "" if report.patch_set == DEFAULT_PATCH_SET else f" --patch {report.patch_set}"
    if status == "conflict":
        return [
            diagnosis(
                "patch-not-applied", host, evidence or ["conflict"], seen_by="fleet patch --check",
                patch=report.patch_set, version=report.vllm_version, state="conflicts",
                option=f"{option} --diff",
            )
        ]  # fmt: skip
    return [
        diagnosis(
            "patch-not-applied", host, evidence or [status], seen_by="fleet patch --check",
            patch=report.patch_set, version=report.vllm_version, state="is not applied",
            option=option,
        )
    ]  # fmt: skip

# fleet on-host module: the rehearsal vLLM's load, from the EngineCore's start to ready.
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# The EngineCore and its workers start (vllm_sim_proc.py), then the load as vLLM runs it,
# compressed to the host's load_seconds (SIM_PHASES): init_device (the process group, NCCL,
# the free GPU memory each rank needs), the target's weights (tqdm's safetensors bar, a
# shard per update, GPU memory rising in nvidia-smi), the drafter's, the checks vLLM makes
# of EAGLE-3 while loading (SupportsEagle3 on the outer model class, the proposer's
# image_token_index path) and in the profile run (the drafter's first forward pass, its
# shapes against the target's), torch.compile (none with --enforce-eager), then the KV
# cache and the CUDA graphs (vllm_sim_kv.py). A multimodal target whose modalities are
# all limited to 0 (--limit-mm-per-prompt) runs as text only, as vLLM does.
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from fleet.onhost.rehearsal.source_mining import (
    class_decorators,
    config_registry,
    find_assert,
    find_log_call,
    find_string,
    multimodal_image_token,
    source_file,
    string_constant,
    supported_modalities,
    supports_multimodal,
)
from fleet.onhost.rehearsal.vllm_sim_config import (
    drafter_bytes,
    engine_config,
    is_mla,
    target_bytes,
)
from fleet.onhost.rehearsal.vllm_sim_faults import (
    fail_profile,
    fail_rendezvous,
    fail_workers,
    stall,
    weights_fault,
)
from fleet.onhost.rehearsal.vllm_sim_kv import capture_graphs, kv_cache
from fleet.onhost.rehearsal.vllm_sim_nodes import SimRendezvousError
from fleet.onhost.rehearsal.vllm_sim_out import Frame, Tqdm
from fleet.onhost.rehearsal.vllm_sim_proc import SimChild, sim_spawn_engine, sim_spawn_workers
from fleet.onhost.rehearsal.vllm_sim_src import EXECUTOR, PROPOSERS, RUNNER, site_path
from fleet.onhost.rehearsal.vllm_sim_state import (
    MIB,
    SIM_PHASES,
    SimProcess,
    SimState,
    gib,
)
from fleet.onhost.vllm_tree import find_class, model_classes

SIM_NCCL_VERSION = "2.27.5"
# weight_utils.py _BAR_FORMAT (0.10.2-0.33.0), used if the installed file lacks it
SIM_BAR_FORMAT = (
    "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, "
    "{rate_fmt}]\n"
)
SIM_ATTN_MLA = ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"]
SIM_ATTN = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]
_CLASSES_CACHE: Dict[str, Any] = {}


def model_classes_all(package_dir: str) -> Dict[str, Any]:
    if package_dir not in _CLASSES_CACHE:
        _CLASSES_CACHE[package_dir] = model_classes(package_dir)
    return _CLASSES_CACHE[package_dir]


def load(sim: SimState) -> None:
    """The EngineCore's start-up after its workers started: init_device to the CUDA
    graphs, then vLLM's "init engine (profile, create kv cache, warmup model) took"."""
    init_device(sim)
    load_weights(sim)
    if sim.drafter is not None:
        load_drafter(sim)
    check_eagle3(sim)
    sim.say("model_loading", (weights_gib(sim), time.monotonic() - sim.load_started))
    if mm_inputs(sim):
        # profile_run profiles the encoder only for multimodal inputs (not text only)
        sim.say("encoder_cache", (16384, 1, "image"), procs=sim.workers)
    torch_compile(sim)
    kv_cache(sim)
    capture_graphs(sim)
    sim.say(
        "init_engine",
        (time.monotonic() - sim.init_started,),
        labels={
            "took": time.monotonic() - sim.init_started,
            "compilation": sim.compile_seconds,
            "language model": sim.compile_seconds,
            "encoder": 0.0,
        },
    )


def start_engine(sim: SimState) -> None:
    """The EngineCore process, its config line, then its workers (this node's ranks)."""
    sim.phase = "engine"
    text_only = is_multimodal(sim) and not mm_inputs(sim)
    if text_only and not sim.nodes.headless:
        sim.say("text_only", ())
    first = sim.nodes.rank0
    titles = ["VLLM::" + sim.worker_name(first + r) for r in range(sim.nodes.local_world)]
    spawned = sim_spawn_engine(sys.executable, titles, sim.gpus.path, sim.api.pid)
    engine_child: SimChild = spawned["engine"]
    if int(sim.args.get("shutdown_timeout") or 0) > 0:
        engine_child.drain_on_sigterm()
    sim.worker_pipes = spawned["worker_pipes"]
    sim.worker_titles = titles
    sim.engine = SimProcess(sim, engine_child.pid, engine_child)
    sim.say_platform(sim.engine)
    sim.engine.decorate(sim.family["engine_name"])
    if not sim.nodes.headless:
        sim.say("engine_init", (sim.version, engine_config(sim)))
        if text_only:
            sim.say("text_only", (), procs=[sim.engine])
        addr = sim.nodes.master_addr if sim.nodes.multinode else "127.0.0.1"
        sim.say(
            "dp_leader",
            (0, 0, addr, addr, sim.tp * sim.pp, sim.nodes.local_world),
        )
    sim.sleep("engine")
    children = sim_spawn_workers(engine_child, titles, sim.worker_pipes)
    sim.workers = [SimProcess(sim, c.pid, c) for c in children]
    for proc in sim.workers:
        sim.say_platform(proc)
        if sim.family["worker_early_prefix"]:
            proc.decorate("Worker")


def init_device(sim: SimState) -> None:
    sim.phase = "init_device"
    sim.init_started = time.monotonic()
    world = sim.tp * sim.pp
    first = sim.nodes.rank0
    method = "tcp://127.0.0.1:%d" % (29500 + os.getpid() % 20000)
    if sim.nodes.multinode:
        method = "tcp://%s:%d" % (sim.nodes.master_addr, sim.nodes.master_port)
    try:
        sim.nodes.rendezvous()
        sim.nodes.ray_place()
    except SimRendezvousError as failed:
        fail_rendezvous(sim, str(failed))
    sim.say(
        "world",
        per_proc=lambda i, p: ((world, first + i, i, method, "nccl"), None),
    )
    if sim.knobs.get("fault") == "nccl":
        fail_workers(
            sim,
            "init_device",
            sim.src.chain(
                [
                    (
                        ("distributed/device_communicators/pynccl.py",),
                        "__init__",
                        "ncclCommInitRank(",
                        None,
                    ),
                    (
                        ("distributed/device_communicators/pynccl_wrapper.py",),
                        "ncclCommInitRank",
                        "self.NCCL_CHECK(",
                        "NCCL_CHECK",
                    ),
                    (
                        ("distributed/device_communicators/pynccl_wrapper.py",),
                        "NCCL_CHECK",
                        "raise RuntimeError(",
                        None,
                    ),
                ]
            ),
            "RuntimeError: NCCL error: unhandled system error "
            "(run with NCCL_DEBUG=INFO for details)",
            sim.workers,
        )
    sim.say("nccl", (SIM_NCCL_VERSION,))
    check_free_memory(sim)
    sim.say(
        "rank",
        per_proc=lambda i, p: (
            None,
            {
                "rank": first + i,
                "world size": world,
                "dp rank": 0,
                "pp rank": (first + i) // sim.tp,
                "pcp rank": 0,
                "tp rank": (first + i) % sim.tp,
                "etp rank": "N/A",
                "ep rank": (first + i) % sim.tp,
                "eplb rank": "N/A",
            },
        ),
    )
    sim.sleep("init_device")
    for i, proc in enumerate(sim.workers):
        proc.decorate(sim.worker_name(first + i), sim.family["worker_prefix"])
    if is_multimodal(sim) and not mm_inputs(sim):
        # init_device ends by building the worker's model runner, which asks
        sim.say("text_only", (), procs=sim.workers)


def check_free_memory(sim: SimState) -> None:
    used = sim.gpus.used_by_others(sim.api.pid)
    total = sim.gpu_total_mib * MIB
    requested = sim.util * total
    short = [
        i for i in range(min(len(sim.workers), sim.gpu_count)) if total - used[i] * MIB < requested
    ]
    if not short:
        return
    procs = [sim.workers[i] for i in short]

    def message(i: int) -> str:
        free = total - used[i] * MIB
        return sim.src.message(
            ("v1/worker/utils.py", "v1/worker/gpu_worker.py"),
            "is less than desired GPU memory utilization",
            {
                "device_": "cuda:%d" % i,
                "device": "cuda:%d" % i,
                "free_memory": gib(free),
                "total_memory": gib(total),
                "gpu_memory_utilization": sim.util,
                "requested_memory": gib(requested),
                "GiB_bytes": 1,
            },
            "Free memory on device cuda:%d (%s/%s GiB) on startup is less than desired GPU "
            "memory utilization (%s, %s GiB). Decrease GPU memory utilization or reduce GPU "
            "memory used by other processes."
            % (i, gib(free), gib(total), sim.util, gib(requested)),
        )

    frames = sim.src.chain(
        [
            (("v1/worker/gpu_worker.py",), "init_device", "request_memory(", "request_memory"),
            (("v1/worker/utils.py",), "request_memory", "raise ValueError(", None),
        ]
    )
    fail_workers(
        sim,
        "init_device",
        frames,
        None,
        procs,
        per_worker=lambda i: "ValueError: " + message(short[i]),
    )


def weights_gib(sim: SimState) -> float:
    return gib(target_bytes(sim) + (drafter_bytes(sim) if sim.drafter else 0))


def bar_format(sim: SimState) -> Optional[str]:
    return string_constant(sim.pkg, "model_executor/model_loader/weight_utils.py", "_BAR_FORMAT")


def weight_bar(
    sim: SimState, proc: SimProcess, total: int, seconds: float, label: str, fault_at: Optional[int]
) -> None:
    """The safetensors bar of one checkpoint on TP0's stderr, a shard per update."""
    fmt = bar_format(sim) or SIM_BAR_FORMAT
    bar = Tqdm(proc.stderr, "Loading safetensors checkpoint shards", total, fmt, mininterval=0)
    step = seconds / max(1, total)
    per_shard = target_bytes(sim) / max(1, total) / MIB if label == "target" else 0
    for n in range(1, total + 1):
        sim.pause(step)
        if fault_at is not None and n == fault_at:
            weights_fault(sim, proc, bar, n, total)
        bar.update(1)
        if label == "target":
            sim.gpu_entries(per_shard * n + 900)
    bar.close()


def load_weights(sim: SimState) -> None:
    sim.phase = "weights"
    sim.load_started = time.monotonic()
    sim.say("load_start", (sim.model_path,))
    sim.say("attn", attn_args(sim, mla=is_mla(sim)))
    if is_int4(sim):
        sim.say("moe", (), procs=sim.workers)
    shards = len(sim.target.shards) or 64
    fault_at = None
    fault = sim.knobs.get("fault")
    here = fault != "stall" or sim.knobs.get("fault_phase", "weights") == "weights"
    if fault in ("oom", "stall", "truncated-line") and here:
        at = sim.knobs.get("fault_at_shard")
        fault_at = int(at) if at is not None else max(1, shards // 3)
    started = time.monotonic()
    weight_bar(
        sim,
        sim.workers[0],
        shards,
        sim.load_seconds * dict(SIM_PHASES)["weights"],
        "target",
        fault_at,
    )
    sim.say("weights_took", (time.monotonic() - started,))


def attn_args(sim: SimState, mla: bool) -> Tuple[Any, ...]:
    found = sim.src.msg("attn")
    names = SIM_ATTN_MLA if mla else SIM_ATTN
    if found is not None and not found["fmt"].rstrip().endswith("."):
        return (names[0], tuple(names))
    return (names[0], names)


def is_int4(sim: SimState) -> bool:
    quant = sim.target.config.get("quantization_config") or sim.target.text.get(
        "quantization_config"
    )
    return isinstance(quant, dict) and quant.get("quant_method") == "compressed-tensors"


def is_multimodal(sim: SimState) -> bool:
    return supports_multimodal(model_classes_all(sim.pkg)["files"], sim.target.arch)


def _limit(value: Any) -> Optional[int]:
    """One modality's --limit-mm-per-prompt value: a count, or {"count": N, ...}."""
    if isinstance(value, dict):
        value = value.get("count")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def mm_inputs(sim: SimState) -> bool:
    """MultiModalRegistry.supports_multimodal_inputs (multimodal/registry.py): a
    multimodal target takes multimodal inputs unless every modality its processing info
    supports (`get_supported_mm_limits`, read from the target's model file) is limited to
    0 by --limit-mm-per-prompt; then vLLM runs it "in text-only mode"."""
    if not is_multimodal(sim):
        return False
    limits = sim.args.get("limit_mm_per_prompt")
    if not isinstance(limits, dict):
        return True
    modalities = None
    for rel, entry in sorted(model_classes_all(sim.pkg)["files"].items()):
        classes = entry.get("classes") if isinstance(entry, dict) else None
        if isinstance(classes, dict) and sim.target.arch in classes:
            modalities = supported_modalities(sim.pkg, rel)
            break
    if not modalities:
        return True
    return not all(_limit(limits.get(m)) == 0 for m in modalities)


def load_drafter(sim: SimState) -> None:
    sim.phase = "drafter"
    drafter = sim.drafter
    assert drafter is not None
    sim.say("drafter", ())
    sim.say("attn", attn_args(sim, mla=False))
    started = time.monotonic()
    weight_bar(
        sim,
        sim.workers[0],
        max(1, len(drafter.shards)),
        sim.load_seconds * dict(SIM_PHASES)["drafter"] * 0.6,
        "drafter",
        None,
    )
    sim.say("weights_took", (time.monotonic() - started,))
    check_image_token(sim)
    if drafter.tensors:
        embed = (
            "Detected EAGLE model with distinct embed_tokens weights"
            if drafter.has_tensor("embed_tokens.weight")
            else None
        )
        head = drafter.has_tensor("lm_head.weight")
    else:
        embed, head = "x", True
    if embed:
        sim.say("eagle_embed", ())
    else:
        say_sharing(sim, "embed_tokens")
    if head:
        sim.say("eagle_lm_head", ())
    else:
        say_sharing(sim, "lm_head")
    sim.sleep("drafter", 0.4)


def say_sharing(sim: SimState, what: str) -> None:
    needle = "Detected EAGLE model without its own %s" % what
    found = find_log_call(sim.pkg, list(PROPOSERS), [needle])
    if found is not None and found["level"] != "DEBUG":
        for proc in sim.workers:
            proc.log(found["level"], found["basename"], found["line"], found["fmt"])


def check_image_token(sim: SimState) -> None:
    """The proposer's multimodal branch, followed for this target class."""
    if not is_multimodal(sim):
        return
    found = multimodal_image_token(sim.pkg, sim.target.arch)
    if found is None:
        return
    obj: Any = sim.target.config
    for attr in found["path"]:
        if isinstance(obj, dict) and attr in obj:
            obj = obj[attr]
            continue
        cls = config_registry(sim.pkg).get(sim.target.model_type, "PretrainedConfig")
        frames = sim.src.chain(
            [((RUNNER,), "load_model", "self.drafter.load_model(", "load_model")]
        )
        rel = found["file"]
        src_line = sim.src.frame(
            (rel,),
            found["func"].rsplit(".", 1)[-1],
            "target_model.config." + ".".join(found["path"]),
        )
        if src_line is not None:
            frames.append(src_line)
        else:
            frames.append(Frame(sim.src.path(rel), found["line"], "load_model", ""))
        fail_workers(
            sim,
            "load_model",
            frames,
            "AttributeError: '%s' object has no attribute '%s'" % (cls, attr),
            sim.workers,
        )


def check_eagle3(sim: SimState) -> None:
    """gpu_model_runner.load_model: `supports_eagle3(self.get_model())` on the OUTER
    class when EAGLE-3 asks for aux hidden states."""
    if sim.drafter is None or sim.method != "eagle3":
        return
    judged = find_class(model_classes_all(sim.pkg)["files"], sim.target.arch)
    if judged is not None and judged["supported"]:
        ids = sim.drafter.aux_layer_ids(sim.v)
        if ids is not None:
            sim.say("aux_layers", (tuple(ids),), procs=sim.workers)
        sim.aux_ids = ids or [2, sim.target.layers // 2, sim.target.layers - 3]
        return
    found = sim.src.raise_site((RUNNER,), "does not support EAGLE3 interface")
    frames = []
    if found is not None:
        frames.append(Frame(sim.src.path(RUNNER), found["line"], found["func"], found["text"]))
    fail_workers(
        sim,
        "load_model",
        frames,
        "RuntimeError: Model does not support EAGLE3 interface but "
        "aux_hidden_state_outputs was requested",
        sim.workers,
    )


def torch_compile(sim: SimState) -> None:
    """The profile run (gpu_worker.determine_available_memory -> profile_run): the
    target's and the drafter's first forward passes, compiled by torch.compile on the way
    unless --enforce-eager (CompilationMode.NONE: vLLM's compilation backend, its
    monitor and their lines stay out)."""
    sim.phase = "compile"
    started = time.monotonic()
    if bool(sim.args.get("enforce_eager")):
        sim.sleep("compile", 0.2)
        drafter_first_forward(sim)
        check_drafter_shapes(sim)
        sim.compile_seconds = 0.0
        return
    home = os.path.expanduser("~")
    tag = "%010x" % (abs(hash(sim.model_path + sim.version)) % (1 << 40))
    parts = ["backbone"] + (["eagle_head"] if sim.drafter is not None else [])
    for part in parts:
        path = os.path.join(home, ".cache/vllm/torch_compile_cache", tag, "rank_0_0", part)
        sim.say("compile_cache", (path,), labels={"": "", "cache directory": path})
        sim.sleep("compile", 0.2)
        sim.say(
            "dynamo",
            (time.monotonic() - started,),
            labels={"": "", "transform time": time.monotonic() - started},
        )
        if part == "eagle_head":
            drafter_first_forward(sim)
            check_drafter_shapes(sim)
        sim.sleep("compile", 0.3)
        rng = "(1, %d)" % int(sim.args.get("max_num_batched_tokens") or 8192)
        sim.say(
            "compile_range",
            (rng, time.monotonic() - started),
            labels={"": "", "compile range": rng, "takes": time.monotonic() - started},
        )
    if sim.knobs.get("fault") == "stall" and sim.knobs.get("fault_phase") == "compile":
        stall(sim)
    sim.compile_seconds = time.monotonic() - started
    sim.say("compile_total", (sim.compile_seconds,))
    sim.say("warmup", (sim.compile_seconds,), labels={"": "", "run took": sim.compile_seconds})


LLAMA_EAGLE3 = "model_executor/models/llama_eagle3.py"
# torch (not vLLM): the frames its decorators and modules add, torch 2.10's lines
SIM_TORCH_INFERENCE = (
    "torch/utils/_contextlib.py",
    124,
    "decorate_context",
    "            return func(*args, **kwargs)",
)
SIM_TORCH_ASSERT = ("torch/__init__.py", 2233, "_assert", "    assert condition, message")


def _torch_frame(where: Tuple[str, int, str, str]) -> Frame:
    return Frame(site_path(where[0]), where[1], where[2], where[3])


def _inference_mode(sim: SimState, rels: Tuple[str, ...], qualname: str) -> List[Frame]:
    """torch's decorate_context frame when the installed function is decorated with
    @torch.inference_mode()."""
    for rel in rels:
        names = class_decorators(sim.pkg, rel, qualname)
        if names:
            if any(n.endswith("inference_mode") for n in names):
                return [_torch_frame(SIM_TORCH_INFERENCE)]
            return []
    return []


def embeds_width(sim: SimState) -> int:
    """How wide the input embeddings of the drafter's dummy run are.

    The proposer's dummy_run passes its `inputs_embeds` buffer (the drafter's own
    inputs_embeds size: its hidden size) when it takes multimodal inputs, else input ids,
    which the drafter embeds with embed_tokens: the target's, shared, when the drafter's
    checkpoint carries none (v1/spec_decode/eagle.py _maybe_share_embeddings, 0.11.1+:
    "Detected EAGLE model without its own embed_tokens"), its own otherwise (before
    0.11.1 vLLM shares only an embedding of the target's shape)."""
    drafter = sim.drafter
    assert drafter is not None
    hidden = int(drafter.get("hidden_size", 0) or 0)
    if mm_inputs(sim):
        dummy = None
        for rel in PROPOSERS:
            src = source_file(sim.pkg, rel)
            fn = src.function("dummy_run") if src is not None else None
            if src is not None and fn is not None:
                dummy = src.segment(fn)
                break
        if dummy is not None and "self.inputs_embeds[" in dummy:
            return hidden
    shares = any(
        find_string(sim.pkg, rel, "Detected EAGLE model without its own embed_tokens")
        for rel in PROPOSERS
    )
    if shares and drafter.tensors and not drafter.has_tensor("embed_tokens.weight"):
        return int(sim.target.get("hidden_size", 0) or 0)
    for name, entry in drafter.tensors.items():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if name.endswith("embed_tokens.weight") and isinstance(shape, list) and len(shape) == 2:
            return int(shape[1])
    return hidden


def drafter_first_forward(sim: SimState) -> None:
    """The drafter's first forward pass: its dummy run inside the target's in the profile
    run (gpu_model_runner._dummy_run -> drafter.dummy_run -> the EAGLE-3 LlamaModel's
    forward). That forward first checks that the hidden states it is given (the
    proposer's buffer, the drafter's hidden size wide) are as wide as the input
    embeddings (`embeds_width`): a bare `assert` up to 0.20, `torch._assert` with a
    message from 0.25, read from the installed llama_eagle3.py. A drafter of another
    hidden size than the target's that shares the target's embedding fails here, in every
    worker (vLLM 0.17's CPU engine: tests/corpus/engine/drafter-incompatible--*)."""
    drafter = sim.drafter
    if drafter is None or sim.method != "eagle3":
        return
    check = find_assert(sim.pkg, LLAMA_EAGLE3, "LlamaModel.forward", "input_embeds.shape[-1]")
    hidden = int(drafter.get("hidden_size", 0) or 0)
    if check is None or not hidden or embeds_width(sim) == hidden:
        return
    frames = sim.src.chain(PROFILE_RUN)
    frames += _inference_mode(sim, (RUNNER,), "_dummy_run")
    frames += sim.src.chain([((RUNNER,), "_dummy_run", "self.drafter.dummy_run(", "dummy_run")])
    frames += _inference_mode(sim, PROPOSERS, "dummy_run")
    frames += sim.src.chain([(PROPOSERS, "dummy_run", "self.model(", None)])
    frames += [_torch_frame(w) for w in SIM_TORCH_MODULE_CALL]
    frames += sim.src.chain(
        [
            ((LLAMA_EAGLE3,), "forward", "return self.model(input_ids, positions", "model"),
            (("compilation/decorators.py",), "__call__", "return self.forward(", "forward"),
        ]
    )
    frames.append(
        Frame(
            sim.src.path(LLAMA_EAGLE3),
            check["line"],
            check["func"],
            check["raw"],
            "_assert" if check["call"] else None,
        )
    )
    exc = "AssertionError"
    if check["call"]:
        frames.append(_torch_frame(SIM_TORCH_ASSERT))
    if check["message"]:
        exc += ": " + check["message"]
    fail_profile(sim, frames, exc)


# a worker's profile run, down to the runner's dummy run (the drafter's checks start there)
PROFILE_RUN = [
    ((EXECUTOR,), "worker_busy_loop", "output = func(", "func"),
    (
        ("v1/worker/gpu_worker.py",),
        "determine_available_memory",
        "self.model_runner.profile_run()",
        "profile_run",
    ),
    ((RUNNER,), "profile_run", "self._dummy_run(", "_dummy_run"),
]
# torch.nn.Module.__call__ (torch 2.10's lines)
SIM_TORCH_MODULE_CALL = (
    (
        "torch/nn/modules/module.py",
        1776,
        "_wrapped_call_impl",
        "            return self._call_impl(*args, **kwargs)",
    ),
    (
        "torch/nn/modules/module.py",
        1787,
        "_call_impl",
        "            return forward_call(*args, **kwargs)",
    ),
)


def check_drafter_shapes(sim: SimState) -> None:
    """The drafter's fc (combine_hidden_states) on the target's aux hidden states: it
    takes 3 x its target_hidden_size (else hidden_size), the target gives 3 x its own
    (fewer states when an aux layer id is out of range): a matmul shape error. Shown in
    the profile run, as the rehearsal always has; in vLLM 0.17's source the dummy run
    does not call fc (propose does, at the first request), and no real engine log has
    shown the point yet (docs/research/vllm-serve.md §5.3, §7). A drafter that does not
    even fit its input embeddings fails before, in `drafter_first_forward`."""
    drafter = sim.drafter
    if drafter is None or sim.method != "eagle3":
        return
    target_hidden = int(sim.target.get("hidden_size", 0) or 0)
    hidden = int(drafter.get("target_hidden_size", 0) or drafter.get("hidden_size", 0) or 0)
    ids = getattr(sim, "aux_ids", None) or []
    valid = [i for i in ids if 0 <= i < max(1, sim.target.layers)]
    if hidden == target_hidden and len(valid) == len(ids):
        return
    tokens = int(sim.args.get("max_num_batched_tokens") or 8192)
    got = target_hidden * len(valid)
    frames = sim.src.chain(
        [
            *PROFILE_RUN,
            ((RUNNER,), "_dummy_run", "self.drafter.dummy_run(", "dummy_run"),
            (PROPOSERS, "dummy_run", "self.model(", None),
            (
                ("model_executor/models/llama_eagle3.py",),
                "LlamaForCausalLMEagle3.forward",
                "self.model(",
                None,
            ),
            (
                ("model_executor/models/llama_eagle3.py",),
                "LlamaModel.forward",
                "self.fc(",
                None,
            ),
        ]
    )
    frames.append(
        Frame(
            site_path("torch/nn/modules/module.py"),
            1775,
            "_wrapped_call_impl",
            "        return self._call_impl(*args, **kwargs)",
        )
    )
    frames.append(
        Frame(
            site_path("torch/nn/modules/module.py"),
            1786,
            "_call_impl",
            "        return forward_call(*args, **kwargs)",
        )
    )
    shapes = "%dx%d and %dx%d" % (tokens, got, 3 * hidden, hidden)
    exc = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (%s)" % shapes
    fail_profile(sim, frames, exc)

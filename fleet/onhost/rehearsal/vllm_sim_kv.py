# fleet on-host module: the rehearsal vLLM's KV cache and CUDA graphs (the end of the load).
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# The KV cache gets what the GPU memory utilization leaves after the weights (target and
# drafter, per GPU), the activations and (from 0.21) the CUDA graphs; its size in tokens
# follows from the bytes a token takes (MLA's latent, else the KV heads per rank). Too
# little for one request of max_model_len, or none, fails as vLLM fails
# (vllm_sim_faults.fail_kv). Then the CUDA graphs are captured (tqdm's bars), unless eager.
import time

from fleet.onhost.rehearsal.source_mining import find_string
from fleet.onhost.rehearsal.vllm_sim_config import drafter_bytes, is_mla, target_bytes
from fleet.onhost.rehearsal.vllm_sim_faults import fail_kv, stall
from fleet.onhost.rehearsal.vllm_sim_out import Tqdm
from fleet.onhost.rehearsal.vllm_sim_src import RUNNER
from fleet.onhost.rehearsal.vllm_sim_state import GIB, MIB, SIM_PHASES, SimState, gib

SIM_GRAPH_SIZES = (("mixed prefill-decode", "PIECEWISE", 51), ("decode", "FULL", 35))


def kv_cache(sim: SimState) -> None:
    sim.phase = "kv"
    sim.sleep("kv", 0.5)
    total = sim.gpu_total_mib * MIB
    requested = sim.util * total
    activation = 6.2 * GIB
    graphs = 3.4 * GIB if sim.v >= (0, 21) else 0.0
    if sim.v >= (0, 21):
        # CUDA-graph memory profiling is the default from 0.21 (gpu_worker.py)
        sim.say("cg_profiling", ("{'mixed prefill-decode': 51, 'decode': 35}",))
        sim.say("cg_estimate", (graphs / GIB,))
    kv = requested - target_bytes(sim) - drafter_bytes(sim) - activation - graphs
    sim.kv_bytes = max(0.0, kv)
    sim.say("kv_memory", (gib(sim.kv_bytes),))
    sim.gpu_entries(requested / MIB * 0.97)
    if kv <= 0:
        fail_kv(
            sim,
            "No available memory for the cache blocks",
            {},
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
        )
    per_token = kv_bytes_per_token(sim)
    tokens = int(sim.kv_bytes // per_token) // 16 * 16
    needed = per_token * sim.max_model_len
    if tokens < sim.max_model_len:
        estimated = tokens
        # _check_enough_kv_cache_memory builds this part first, only for a length > 0
        estimated_msg = ""
        if estimated > 0:
            estimated_msg = sim.src.message(
                ("v1/core/kv_cache_utils.py",),
                "the estimated maximum model length is",
                {"estimated_max_len": estimated},
                "",
            )
        msg = sim.src.message(
            ("v1/core/kv_cache_utils.py",),
            "To serve at least one request with the models",
            {
                "max_model_len": sim.max_model_len,
                "needed_memory": needed / GIB,
                "available_memory": sim.kv_bytes / GIB,
                "estimated_max_len": estimated,
                "estimated_msg": estimated_msg,
                "GiB_bytes": 1,
            },
            "To serve at least one request with the models's max seq len (%d), (%.2f GiB KV "
            "cache is needed, which is larger than the available KV cache memory (%.2f GiB)."
            % (sim.max_model_len, needed / GIB, sim.kv_bytes / GIB),
        )
        fail_kv(sim, "max seq len", {}, "ValueError: " + msg)
    conc = tokens / float(sim.max_model_len)
    found = sim.src.msg("kv_size")
    merged = found is not None and "Maximum concurrency" in found["fmt"]
    sim.say(
        "kv_size",
        (f"{tokens:,}",),
        labels={
            "": "GPU",
            "kv cache size": f"{tokens:,}",
            "maximum concurrency for": f"{sim.max_model_len:,}",
            "tokens per request": conc,
        },
    )
    if not merged:
        sim.say("kv_concurrency", (f"{sim.max_model_len:,}", conc))
    sim.kv_tokens = tokens
    sim.sleep("kv", 0.5)


def kv_bytes_per_token(sim: SimState) -> float:
    layers = max(1, sim.target.layers or 61)
    if is_mla(sim):
        width = int(sim.target.get("kv_lora_rank", 512)) + int(
            sim.target.get("qk_rope_head_dim", 64)
        )
        return float(width * 2 * layers)
    heads = int(sim.target.get("num_key_value_heads", 8) or 8)
    head_dim = int(sim.target.get("head_dim", 128) or 128)
    return float(2 * max(1, heads // max(1, sim.tp)) * head_dim * 2 * layers)


def capture_graphs(sim: SimState) -> None:
    sim.phase = "graphs"
    started = time.monotonic()
    if sim.knobs.get("fault") == "stall" and sim.knobs.get("fault_phase") == "graphs":
        stall(sim)
    desc = None
    found = None
    found = find_string(sim.pkg, RUNNER, "Capturing CUDA graphs")
    desc = found["text"] if found is not None else "Capturing CUDA graphs ({}, {})"
    if not bool(sim.args.get("enforce_eager")):
        seconds = sim.load_seconds * dict(SIM_PHASES)["graphs"] * 0.9
        total_items = sum(n for _a, _b, n in SIM_GRAPH_SIZES)
        for kind, mode, count in SIM_GRAPH_SIZES:
            text = desc.replace("{}", kind, 1).replace("{}", mode, 1)
            proc = sim.workers[0]
            bar = Tqdm(proc.stderr, text, count, None, mininterval=0)
            for _ in range(count):
                sim.pause(seconds / total_items)
                bar.update(1)
            bar.close()
        sim.say("graphs_done", (time.monotonic() - started, 3.4))
    sim.gpu_entries(sim.util * sim.gpu_total_mib)

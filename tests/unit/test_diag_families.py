"""Rules mined from vLLM's raise sites: families of messages mapped by what they check, the
committed coverage table kept in step with the catalogue, and specific messages ranked above
the family that also covers them."""

# ruff: noqa: E501  (real vLLM messages are long lines)

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from fleet.diagnosis import diagnose
from fleet.diagnosis.catalogue import load_catalogue, template_patterns
from fleet.diagnosis.models import ROLE_TIER, TAXONOMY

TABLE = Path(__file__).resolve().parents[2] / "docs" / "raise-sites.tsv"
MSG_CUT = 240  # the table cuts messages at this length
P = "(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] "


def _mapped(text: str) -> str:
    pats = template_patterns(load_catalogue(), text)
    if not pats:
        return "-"
    return min(pats, key=lambda p: (ROLE_TIER[p.role], -p.specificity)).rule.id


def test_the_committed_table_matches_the_catalogue() -> None:
    """docs/raise-sites.tsv is what scripts/mine_raise_sites.py wrote with this catalogue:
    every (uncut) row still maps to the id it names -- regenerate the table after a rule
    change."""
    rows = list(csv.DictReader(TABLE.open(encoding="utf-8"), delimiter="\t"))
    assert len(rows) > 1000
    stale = []
    for row in rows:
        if len(row["message"]) >= MSG_CUT:
            continue
        text = f"{row['exception']}: {row['message']}" if row["exception"] else row["message"]
        if _mapped(text) != row["id"]:
            stale.append((row["id"], _mapped(text), text[:120]))
    assert not stale, stale[:10]
    assert {r["id"] for r in rows} - {"-"} <= set(TAXONOMY)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # the speculative config's own validation (config/speculative.py, config/vllm.py)
        (
            "ValueError: num_speculative_tokens:4 must be divisible by n_predict=3",
            "spec-config-invalid",
        ),
        (
            "  Value error, Inkling MTP currently supports exactly one speculative token [type=value_error, input_value=ArgsKwargs((), {})]",
            "spec-config-invalid",
        ),
        (
            "ValueError: Currently, async scheduling is only supported with EAGLE/MTP kind of speculative decoding",
            "spec-config-invalid",
        ),
        (
            "NotImplementedError: Speculative Decoding with draft models does not support multimodal models yet",
            "spec-config-invalid",
        ),
        # ... but a specific message of the same family keeps its own id
        (
            "ValueError: Target and draft model should have the same vocabulary size. Target model vocab_size=163840. Draft model vocab_size=32000.",
            "drafter-incompatible",
        ),
        (
            "ValueError: Qwen3-Omni DSpark draft hidden_size must match the target thinker hidden size (4096); got 2048.",
            "drafter-incompatible",
        ),
        (
            "Value error, Eagle3 is only supported for ['llama', 'qwen'] models. Got self.target_model_config.hf_text_config.model_type='kimi_k2'",
            "eagle3-target-not-allowlisted",
        ),
        # parallel layout
        ("AssertionError: world_size=12 must be divisible by nnodes=8.", "tp-size-invalid"),
        (
            "AssertionError: local_world_size (8) must be less than or equal to the number of visible devices (4).",
            "tp-size-invalid",
        ),
        (
            "ValueError: World size (16) is larger than the number of available GPUs (8) in this node.",
            "tp-size-invalid",
        ),
        # 0.11.1-0.12's text for the same check (TP16 over two nodes without a backend)
        (
            "ValueError: Tensor parallel size (16) cannot be larger than the number of available GPUs (8).",
            "tp-size-invalid",
        ),
        (
            "ValueError: Async scheduling is not supported with pipeline-parallel-size > 1.",
            "pp-layer-mapping-error",
        ),
        # a node that never joined: Ray's placement group wait, a headless engine's handshake
        (
            "ValueError: Cannot provide a placement group requiring 16 GPUs (placement_group_specs=[{'GPU': 1.0}, {'GPU': 1.0}]) within 1800 seconds.",
            "node-join-timeout",
        ),
        (
            "ValueError: Cannot provide a placement group of placement_group_specs=[{'GPU': 1.0}] within 1800 seconds. See `ray status` and `ray list nodes` to make sure the cluster has enough resources.",
            "node-join-timeout",
        ),
        (
            "RuntimeError: Did not receive response from front-end process within 5 minutes",
            "node-join-timeout",
        ),
        # a rank cannot reach the rendezvous store (multi-node start-up)
        (
            "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to connect to (172.17.0.9, 46229).",
            "nccl-timeout",
        ),
        (
            "torch.distributed.DistStoreError: wait timeout after 600000ms, keys: /default_pg/0//cuda//0",
            "nccl-timeout",
        ),
        # memory, packages, engine
        (
            "ValueError: Externally held weights on device cuda:0 (70.0/79.2 GiB) exceed the desired GPU memory utilization (0.9, 71.3 GiB).",
            "gpu-memory-utilization-too-high",
        ),
        (
            "ValueError: Failed to import Ray: No module named 'ray'.Please install Ray with `pip install ray`.",
            "install-abi-mismatch",
        ),
        (
            "ValueError: User-specified max_model_len (300000) is greater than the derived max_model_len. To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
            "max-model-len-too-large",
        ),
    ],
)
def test_family_rules(line: str, expected: str) -> None:
    got = diagnose([P + line])
    assert got and got[0].id == expected, [d.id for d in got]


@pytest.mark.parametrize(
    "line",
    [
        # an assert inside speculative decoding is an internal invariant (a bug), not a bad config
        "AssertionError: All eagle layers should belong to the same kv cache group",
        # words that only look like the family's ("Engram" holds "ngram")
        "ValueError: EngramConfig requires a model with supported Engram embeddings and non-empty n-gram layer ids.",
        # divisibility of something that is not a parallel size
        "ValueError: Invalid hash_block_size=16; all KV cache group block sizes must be divisible by hash_block_size.",
    ],
)
def test_lines_outside_the_families_stay_unrecognized(line: str) -> None:
    assert [d.id for d in diagnose([P + line])] == ["unrecognized-error"]


def test_a_request_rejected_for_speculative_decoding_is_benign() -> None:
    line = "(APIServer pid=1) ERROR 11-02 11:33:19 [serving_chat.py:222] ValueError: The min_tokens, min_p, and logit_bias sampling parameters are not yet supported with speculative decoding."
    assert diagnose([line]) == []


def test_worker_wrappers_rank_below_the_cause() -> None:
    lines = [
        "(Worker_TP1 pid=9) ERROR 11-02 10:15:01 [multiproc_executor.py:1] WorkerProc hit an exception.",
        "(Worker_TP1 pid=9) ERROR 11-02 10:15:01 [multiproc_executor.py:1] Traceback (most recent call last):",
        '(Worker_TP1 pid=9) ERROR 11-02 10:15:01 [multiproc_executor.py:1]   File "/x/vllm/v1/worker/gpu_worker.py", line 1, in execute_model',
        "(Worker_TP1 pid=9) ERROR 11-02 10:15:01 [multiproc_executor.py:1]     out = self.model_runner.execute_model(x)",
        "(Worker_TP1 pid=9) ERROR 11-02 10:15:01 [multiproc_executor.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        P + "EngineCore encountered a fatal error.",
    ]
    assert [d.id for d in diagnose(lines)][:1] == ["cuda-oom"]
    alone = diagnose([lines[0]])
    assert (alone[0].id, alone[0].confidence) == ("worker-died", "low")

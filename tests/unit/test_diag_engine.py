"""The ranking engine: pure, lines in -> ranked diagnoses out."""

# ruff: noqa: E501  (real vLLM messages are long lines)

from __future__ import annotations

from fleet.diagnosis import Engine, diagnose, diagnose_numbered, diagnoses_exit_code, with_values

P = "(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] "
KV = (
    "ValueError: To serve at least one request with the models's max seq len (262144), "
    "(17.16 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(9.73 GiB). Based on the available memory, the estimated maximum model length is 148592. "
    "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
    "the engine."
)
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 3 has a total "
    "capacity of 178.35 GiB of which 1.21 GiB is free."
)
NCCL = (
    "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
    "NCCLUtils.cpp:77, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
    "version 2.26.2"
)
WRAPPER = (
    "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore_DP0': 1}"
)
HEALTHY = [
    "(APIServer pid=1) INFO 11-02 10:14:01 [api_server.py:1839] vLLM API server version 0.17.0",
    "(APIServer pid=1) INFO 11-02 10:14:02 [utils.py:238] non-default args: {'model': 'm', 'port': 8001}",
    "(APIServer pid=1) WARNING 11-02 10:14:02 [config.py:1] The model has a long context length.",
    "Loading safetensors checkpoint shards:  45% Completed | 29/64 [01:02<01:15,  2.15s/it]",
    "(Worker_TP0 pid=9) INFO 11-02 10:20:00 [gpu_model_runner.py:4339] Model loading took 71.9 GiB",
    "(EngineCore_DP0 pid=7) INFO 11-02 10:21:00 [kv_cache_utils.py:1314] GPU KV cache size: 212,032 tokens",
    "(APIServer pid=1) INFO:     Application startup complete.",
    '(APIServer pid=1) INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "(APIServer pid=1) INFO 11-02 10:22:00 [loggers.py:123] Engine 000: Avg prompt throughput: "
    "12.0 tokens/s, Running: 1 reqs, GPU KV cache usage: 0.3%, Prefix cache hit rate: 0.0%",
]


def ids(lines: list[str], **kw: str) -> list[str]:
    return [d.id for d in diagnose(lines, **kw)]


def test_clean_log_gives_empty_list() -> None:
    assert diagnose(HEALTHY) == []
    assert diagnose([]) == []
    assert diagnoses_exit_code([]) == 0


def test_specific_cause_beats_the_wrappers_that_follow_it() -> None:
    lines = [
        *HEALTHY[:3],
        P + "EngineCore failed to start.",
        P + "Traceback (most recent call last):",
        P + '  File "/x/vllm/v1/core/kv_cache_utils.py", line 714, in check_enough_kv_cache_memory',
        P + "    raise ValueError(",
        P + KV,
        "(APIServer pid=1) Traceback (most recent call last):",
        "(APIServer pid=1) " + WRAPPER,
    ]
    result = diagnose(lines)
    assert [d.id for d in result] == ["kv-cache-too-small", "engine-init-failed"]
    top = result[0]
    assert top.evidence[0].line == 8
    assert top.evidence[0].text == KV
    assert top.values["max_len"] == "262144"
    assert top.fix == "--max-model-len 148592"
    assert "148592" in top.summary and "17.16" in top.summary
    assert diagnoses_exit_code(result) == 1


def test_earlier_fatal_cause_beats_a_later_one_whichever_it_is() -> None:
    disk = "(Worker_TP1 pid=10) OSError: [Errno 28] No space left on device: '/root/.cache/vllm'"
    a = [P + OOM, disk]
    assert ids(a) == ["cuda-oom", "disk-full"]
    assert ids(list(reversed(a))) == ["disk-full", "cuda-oom"]


def test_severity_before_position_among_causes() -> None:
    warn = "(APIServer pid=1) WARNING 11-02 10:14:02 [ray_utils.py:293] Tensor parallel size (16) exceeds available GPUs (8). Consider reducing tensor_parallel_size."
    result = diagnose([warn, P + OOM])
    assert [d.id for d in result] == ["cuda-oom", "tp-size-invalid"]
    assert result[1].severity == "error"
    # tp_fit comes from the captured numbers: min(tp, gpus) without head count
    assert result[1].fix == "--tensor-parallel-size 8"


def test_specificity_decides_between_rules_on_one_exception() -> None:
    lines = [
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
        "  Value error, Eagle3 is only supported for ['llama', 'qwen'] models. Got "
        "self.target_model_config.hf_text_config.model_type='kimi_k25' [type=value_error]",
    ]
    result = diagnose(lines, host="b200-01")
    assert [d.id for d in result] == ["eagle3-target-not-allowlisted", "spec-config-invalid"]
    assert result[0].fix == "fleet patch --host b200-01"
    assert result[0].values["model_type"] == "kimi_k25"
    assert "kimi_k25" in result[0].summary
    assert diagnose(lines)[0].fix == "fleet patch --host <host>"


def test_unrecognized_error_reports_the_last_exception_line() -> None:
    lines = [
        *HEALTHY[:2],
        P + "Traceback (most recent call last):",
        P + '  File "/x/gpu_model_runner.py", line 2410, in execute_model',
        P + "    logits = self.model.compute_logits(h)",
        P + "IndexError: index 163840 is out of bounds for dimension 0 with size 163840",
        "(APIServer pid=1) " + WRAPPER,
    ]
    result = diagnose(lines)
    assert [d.id for d in result] == ["unrecognized-error", "engine-init-failed"]
    assert result[0].evidence[0].line == 6
    assert result[0].summary.startswith("IndexError: index 163840")
    assert result[0].severity == "error"


def test_a_known_cause_outranks_an_unrecognized_exception() -> None:
    lines = [P + "KeyError: 'bogus'", P + KV]
    assert ids(lines) == ["kv-cache-too-small", "unrecognized-error"]


def test_an_unexplained_exception_ranks_above_the_wrappers_that_follow_it() -> None:
    """Issue 24: a wrapper (EngineDeadError, "Worker proc died") is the answer only when no
    cause precedes it; an exception no rule names, printed before them, is that cause."""
    died = "(EngineCore_DP0 pid=7) ERROR 11-02 12:40:03 [multiproc_executor.py:154] Worker proc VllmWorker-5 died unexpectedly, shutting down executor."
    dead = "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."
    unknown = "(Worker_TP5 pid=15) RuntimeError: something nobody has seen"
    assert ids([unknown, died, dead]) == ["unrecognized-error", "worker-died", "engine-dead"]
    # after the symptoms it explains nothing: the symptoms stay first
    assert ids([died, dead, unknown]) == ["worker-died", "engine-dead", "unrecognized-error"]
    # a named cause still ranks first, wherever it is
    assert ids([unknown, died, dead, P + OOM]) == [
        "cuda-oom",
        "unrecognized-error",
        "worker-died",
        "engine-dead",
    ]
    got = diagnose([unknown, died, dead])[0]
    assert got.evidence[0].text == "RuntimeError: something nobody has seen"


def test_an_unexplained_exception_outranks_a_wrapper_whose_header_came_first() -> None:
    """vLLM's multiproc executor logs "WorkerProc hit an exception." BEFORE the worker's
    traceback, and "Worker proc ... died unexpectedly" after it: the wrapper's header
    preceding the cause must not make the wrapper the answer."""
    w = "(VllmWorker TP0 pid=9) ERROR 11-02 12:40:01 [multiproc_executor.py:600] "
    lines = [
        w + "WorkerProc hit an exception.",
        w + "Traceback (most recent call last):",
        w
        + '  File "/opt/vllm/vllm/v1/executor/multiproc_executor.py", line 596, in worker_busy_loop',
        w + "    output = func(*args, **kwargs)",
        w + "FrobnicatorError: the frobnicator overheated",
        "(EngineCore_DP0 pid=7) ERROR 11-02 12:40:03 [multiproc_executor.py:154] Worker proc VllmWorker-0 died unexpectedly, shutting down executor.",
    ]
    assert ids(lines)[:2] == ["unrecognized-error", "worker-died"]
    assert diagnose(lines)[0].evidence[0].text.endswith("the frobnicator overheated")


def test_only_the_generic_wrapper_visible() -> None:
    result = diagnose(["(APIServer pid=1) " + WRAPPER])
    assert [d.id for d in result] == ["engine-init-failed"]
    assert "{'EngineCore_DP0': 1}" in result[0].summary


def test_interleaved_workers_keep_their_own_exception_blocks() -> None:
    lines = [
        "(Worker_TP0 pid=9) pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
        "(Worker_TP1 pid=10) AssertionError: weird worker-1 failure",
        "(Worker_TP0 pid=9)   Value error, eagle3 is only supported for ['llama'] models. Got self.target_model_config.hf_text_config.model_type='deepseek_v3'",
    ]
    result = diagnose(lines)
    assert [d.id for d in result] == [
        "eagle3-target-not-allowlisted",
        "spec-config-invalid",
        "unrecognized-error",
    ]
    assert result[2].evidence[0].line == 2


def test_evidence_uses_real_line_numbers_of_sparse_input() -> None:
    pairs = [(1041, "INFO boring"), (100233, P + OOM), (100234, P + "Process EngineCore_DP0:")]
    result = diagnose_numbered(pairs)
    assert result[0].id == "cuda-oom"
    assert result[0].evidence[0].line == 100233
    assert result[0].values["gpu"] == "3"
    assert result[0].values["free"] == "1.21 GiB"


def test_repeated_matches_are_merged_with_a_count() -> None:
    lines = [f"(Worker_TP{i} pid={10 + i}) " + OOM for i in range(8)]
    result = diagnose(lines)
    assert len(result) == 1
    assert result[0].count == 8
    assert len(result[0].evidence) == 5


def test_context_condition_separates_drafter_from_checkpoint() -> None:
    load = "AssertionError: Attempted to load weight (torch.Size([7168, 21504])) into parameter (torch.Size([4096, 12288]))"
    with_eagle = [
        '  File "/x/vllm/model_executor/models/llama_eagle3.py", line 330, in load_weights',
        "    loader.load_weights(model_weights.items())",
        load,
    ]
    assert ids(with_eagle) == ["drafter-incompatible"]
    assert ids(
        [
            '  File "/x/vllm/model_executor/models/deepseek_v2.py", line 1402, in load_weights',
            load,
        ]
    ) == ["checkpoint-weight-mismatch"]


def test_info_lines_only_match_info_patterns() -> None:
    assert diagnose(["INFO 11-02 10:15:01 [x.py:1] No available memory for the cache blocks"]) == []
    result = diagnose(
        ["INFO 11-02 10:15:01 [executor_base.py:112] # GPU blocks: 0, # CPU blocks: 2048"]
    )
    assert [d.id for d in result] == ["kv-cache-no-memory"]


def test_benign_lines_are_not_errors() -> None:
    lines = [
        "WARNING 11-02 10:15:01 [parallel.py:526] Address already in use. Retrying with a new port.",
        "ERROR 11-02 10:15:01 [serving_chat.py:222] ValueError: This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens.",
        "KeyboardInterrupt",
    ]
    assert diagnose(lines) == []


def test_folded_terminal_lines_are_joined() -> None:
    msg = P + KV
    width = 80
    folded = [msg[i : i + width] for i in range(0, len(msg), width)]
    filler = ["x" * width] * 0 + [
        f"INFO 11-02 10:14:0{i} [a.py:1] {'y' * 70}"[:width] for i in range(6)
    ]
    result = diagnose([*filler, *folded])
    assert result and result[0].id == "kv-cache-too-small"
    assert result[0].evidence[0].line == len(filler) + 1
    assert result[0].values["estimated_max_len"] == "148592"


def test_derived_fixes() -> None:
    kv_v0 = "The model's max seq len (29000) is larger than the maximum number of tokens that can be stored in KV cache (23648)."
    assert diagnose([kv_v0])[0].fix == "--max-model-len 23648"
    util = "ValueError: Free memory on device (3.22/4.0 GiB) on startup is less than desired GPU memory utilization (0.9, 3.6 GiB)."
    assert diagnose([util])[0].fix == "--gpu-memory-utilization 0.79"
    heads = "ValueError: Total number of attention heads (64) must be divisible by tensor parallel size (6)."
    d = diagnose([heads])[0]
    assert d.fix == "--tensor-parallel-size 4"
    assert "try 4" in d.summary


def test_port_in_use_names_the_port_and_holder() -> None:
    line = "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use"
    d = diagnose([line])[0]
    assert d.id == "port-in-use"
    assert d.summary == "Port 8000 is already in use"
    assert d.fix == "ss -ltnp 'sport = :8000'"
    held = with_values(d, holder="python3 (pid 4242)", holder_pid="4242")
    assert held.summary == "Port 8000 is already in use (held by python3 (pid 4242))"
    assert held.fix == "kill 4242"


def test_port_from_the_args_line_when_the_error_lacks_it() -> None:
    lines = [HEALTHY[1], "(APIServer pid=1) OSError: [Errno 98] Address already in use"]
    d = diagnose(lines)[0]
    assert d.id == "port-in-use"
    assert d.values["port"] == "8001"
    assert "8001" in d.summary


def test_engine_is_incremental() -> None:
    engine = Engine()
    engine.feed(1, HEALTHY[0])
    assert engine.results() == []
    engine.feed(2, P + OOM)
    first = engine.results()
    engine.feed(3, "(APIServer pid=1) " + WRAPPER)
    assert [d.id for d in engine.results()] == ["cuda-oom", "engine-init-failed"]
    assert [d.id for d in first] == ["cuda-oom"]


def test_contract_shape() -> None:
    d = diagnose([P + OOM])[0].as_contract()
    for key in ("id", "severity", "summary", "evidence", "remedy", "fix"):
        assert key in d
    assert d["evidence"] == [{"line": 1, "text": OOM}]


def test_a_cause_ranks_above_the_consequence_it_explains_wherever_it_is() -> None:
    nccl = "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
    shm = "gpu-1:11:11 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-2SmX to 9637892 bytes"
    assert ids([nccl, shm]) == ["shm-too-small", "nccl-error"]
    assert ids([shm, nccl]) == ["shm-too-small", "nccl-error"]
    oom = "gpu-1:11:11 [0] NCCL WARN Cuda failure 'out of memory'"
    assert ids([nccl, oom]) == ["cuda-oom", "nccl-error"]

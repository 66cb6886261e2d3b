"""Build fleet's own labelled diagnosis corpus (tests/corpus/logs/*.log + labels.json).

Every scenario reproduces one failure the way vLLM prints it: the message string is taken
from vLLM's raise site or log call (the ``source`` of each scenario names the file and the
versions checked, 0.10.2-0.33.0) or from the PyTorch/NCCL/CUDA/Ray/Hugging Face/server
message vLLM passes on. Each scenario is rendered in several shapes:

``v1``           vLLM >= 0.10 output: ``(EngineCore_DP0 pid=N) ERROR mm-dd hh:mm:ss [f.py:L]``
                 prefixes, the multiprocessing re-raise, the API server's generic wrapper
``plain``        no process prefixes (older releases, excerpts pasted into issues)
``interleaved``  the same error printed by several TP workers at once, lines interleaved
``truncated``    only the tail of the traceback (no ``Traceback`` header, no wrappers)
``noisy``        ANSI colours, CI timestamps, carriage-return progress bars and lines
                 folded at the terminal width

Run ``python tests/corpus/build_corpus.py`` to regenerate; the output is committed.
"""

# ruff: noqa: E501  (real vLLM messages are long lines)

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "logs"

SITE = "/usr/local/lib/python3.12/dist-packages"
ENGINE_FRAMES = [
    (
        "vllm/v1/engine/core.py",
        699,
        "run_engine_core",
        "engine_core = EngineCoreProc(*args, **kwargs)",
    ),
    (
        "vllm/v1/engine/core.py",
        498,
        "__init__",
        "super().__init__(vllm_config, executor_class, log_stats,",
    ),
]
API_FRAMES = [
    (
        "vllm/entrypoints/openai/api_server.py",
        1920,
        "run_server_worker",
        "async with build_async_engine_client(",
    ),
    ("vllm/v1/engine/utils.py", 880, "wait_for_engine_startup", "raise RuntimeError("),
]


@dataclass
class Scenario:
    name: str
    id: str
    source: str  # where the key message comes from (cited per sample)
    exc: list[str] = field(default_factory=list)  # final exception line (+ continuation)
    frames: list[tuple[str, int, str, str]] = field(default_factory=list)
    where: str = "engine"  # engine | worker | api | lines
    lines: list[str] = field(default_factory=list)  # for where == "lines" (already prefixed)
    pre: list[str] = field(default_factory=list)  # extra lines before the error (prefixed)
    wrapper: bool = True  # the API server's "Engine core initialization failed" follows
    shapes: tuple[str, ...] = ("v1", "plain", "truncated")


def F(path: str, line: int, func: str, code: str) -> tuple[str, int, str, str]:
    return (path, line, func, code)


SCENARIOS: list[Scenario] = [
    # ---------------------------------------------------------------- speculative decoding
    Scenario(
        "eagle3-runner",
        "eagle3-unsupported-model",
        "vllm/v1/worker/gpu_model_runner.py load_model (0.10.2-0.33.0)",
        exc=[
            "RuntimeError: Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested"
        ],
        frames=[
            F(
                "vllm/v1/worker/gpu_worker.py",
                239,
                "load_model",
                "self.model_runner.load_model(eep_scale_up=eep_scale_up)",
            ),
            F("vllm/v1/worker/gpu_model_runner.py", 3630, "load_model", "raise RuntimeError("),
        ],
        where="worker",
        shapes=("v1", "plain", "interleaved", "truncated", "noisy"),
    ),
    Scenario(
        "eagle3-attr",
        "eagle3-unsupported-model",
        "vllm/v1/worker/gpu_model_runner.py calls SupportsEagle3.set_aux_hidden_state_layers (model without it)",
        exc=[
            "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute 'set_aux_hidden_state_layers'"
        ],
        frames=[
            F(
                "vllm/v1/worker/gpu_model_runner.py",
                4310,
                "load_model",
                "self.model.set_aux_hidden_state_layers(",
            )
        ],
        where="worker",
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "eagle3-allowlist",
        "eagle3-target-not-allowlisted",
        "vllm/config/speculative.py _verify_args eagle3_target_supported (0.11.0-0.16.0)",
        exc=[
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
            "  Value error, Eagle3 is only supported for ['llama', 'qwen', 'minicpm', 'gpt_oss', 'hunyuan_vl', 'hunyuan_v1_dense', 'afmoe'] models. Got self.target_model_config.hf_text_config.model_type='kimi_k25' [type=value_error, input_value=ArgsKwargs((), {'model': ...}), input_type=ArgsKwargs]",
            "    For further information visit https://errors.pydantic.dev/2.11/v/value_error",
        ],
        frames=[
            F(
                "vllm/engine/arg_utils.py",
                1483,
                "create_speculative_config",
                "return SpeculativeConfig(**self.speculative_config)",
            ),
            F(
                "pydantic/_internal/_dataclasses.py",
                123,
                "__init__",
                "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
            ),
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated", "noisy"),
    ),
    Scenario(
        "eagle3-allowlist-aux",
        "eagle3-target-not-allowlisted",
        "vllm/config/speculative.py aux_hidden_states_supported (0.17.0-0.20.0)",
        exc=[
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
            "  Value error, eagle3 is only supported for ['llama', 'qwen', 'minicpm', 'gpt_oss', 'hunyuan_vl', 'hunyuan_v1_dense', 'afmoe', 'mistral3', 'mimo'] models. Got self.target_model_config.hf_text_config.model_type='deepseek_v3' [type=value_error, input_value=ArgsKwargs((), {'model': ...}), input_type=ArgsKwargs]",
        ],
        frames=[
            F(
                "vllm/engine/arg_utils.py",
                1611,
                "create_speculative_config",
                "return SpeculativeConfig(**self.speculative_config)",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "spec-num-tokens",
        "spec-config-invalid",
        "vllm/config/speculative.py (0.17.0-0.20.0) 'A speculative model was provided, but neither ...'",
        exc=[
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
            "  Value error, A speculative model was provided, but neither `speculative_token_tree` nor `num_speculative_tokens` was provided [type=value_error, input_value=ArgsKwargs((), {'method': 'eagle3', 'model': '/models/kimi-eagle3'}), input_type=ArgsKwargs]",
        ],
        frames=[
            F(
                "vllm/engine/arg_utils.py",
                1611,
                "create_speculative_config",
                "return SpeculativeConfig(**self.speculative_config)",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "spec-unknown-key",
        "spec-config-invalid",
        "pydantic extra='forbid' on vllm/config/speculative.py SpeculativeConfig (0.11.0+)",
        exc=[
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
            "num_speculative_token",
            "  Unexpected keyword argument [type=unexpected_keyword_argument, input_value=3, input_type=int]",
        ],
        frames=[
            F(
                "vllm/engine/arg_utils.py",
                1611,
                "create_speculative_config",
                "return SpeculativeConfig(**self.speculative_config)",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "spec-method",
        "spec-config-invalid",
        "vllm/config/speculative.py (0.15.0+) 'Unsupported speculative method'",
        exc=["NotImplementedError: Unsupported speculative method: 'eagle-3'"],
        frames=[
            F("vllm/config/speculative.py", 602, "__post_init__", "raise NotImplementedError(")
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain"),
    ),
    Scenario(
        "drafter-arch-unregistered",
        "drafter-incompatible",
        "vllm/model_executor/models/registry.py _raise_for_unsupported for the drafter's EAGLE architecture (0.10.2-0.33.0)",
        exc=[
            "ValueError: Model architectures ['EagleQwen2ForCausalLM'] are not supported for now. Supported architectures: dict_keys(['AquilaModel', 'AquilaForCausalLM', 'DeepseekV3ForCausalLM', 'EagleLlamaForCausalLM', 'Eagle3LlamaForCausalLM'])"
        ],
        frames=[
            F(
                "vllm/v1/spec_decode/eagle.py",
                1140,
                "load_model",
                "self.model = get_model(vllm_config=self.vllm_config,",
            ),
            F(
                "vllm/model_executor/models/registry.py",
                522,
                "_raise_for_unsupported",
                "raise ValueError(",
            ),
        ],
        where="worker",
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "spec-draft-slots",
        "spec-config-invalid",
        "vllm/config/vllm.py _set_max_num_scheduled_tokens (0.20.0-0.33.0)",
        exc=[
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig",
            "  Value error, max_num_scheduled_tokens is set to -1792 based on the speculative decoding settings, which does not allow any tokens to be scheduled. Increase max_num_batched_tokens to accommodate the additional draft token slots, or decrease num_speculative_tokens. [type=value_error, input_value=ArgsKwargs((), {'model_config': ...}), input_type=ArgsKwargs]",
        ],
        frames=[
            F(
                "vllm/engine/arg_utils.py",
                1902,
                "create_engine_config",
                "config = VllmConfig(",
            ),
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "spec-family-n-predict",
        "spec-config-invalid",
        "vllm/config/speculative.py __post_init__ (0.10.2-0.33.0), a message of the speculative-config family",
        exc=[
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
            "  Value error, num_speculative_tokens:4 must be divisible by n_predict=3 [type=value_error, input_value=ArgsKwargs((), {'method': 'mlp_speculator'}), input_type=ArgsKwargs]",
        ],
        frames=[
            F(
                "vllm/engine/arg_utils.py",
                1483,
                "create_speculative_config",
                "return SpeculativeConfig(**self.speculative_config)",
            ),
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain"),
    ),
    Scenario(
        "drafter-vocab",
        "drafter-incompatible",
        "vllm/config/speculative.py verify_equal_vocab_size_if_draft_model (0.15.0+)",
        exc=[
            "ValueError: Target and draft model should have the same vocabulary size. Target model vocab_size=163840. Draft model vocab_size=128256. Using models with different tokenizers can cause out-of-bounds errors during speculative decoding."
        ],
        frames=[
            F(
                "vllm/config/speculative.py",
                720,
                "verify_equal_vocab_size_if_draft_model",
                "raise ValueError(",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "drafter-shape",
        "drafter-incompatible",
        "vllm/model_executor/model_loader/weight_utils.py default_weight_loader assert, in llama_eagle3.py load_weights",
        exc=[
            "AssertionError: Attempted to load weight (torch.Size([7168, 21504])) into parameter (torch.Size([4096, 12288]))"
        ],
        frames=[
            F(
                "vllm/v1/spec_decode/eagle.py",
                1140,
                "load_model",
                "self.model = get_model(vllm_config=self.vllm_config,",
            ),
            F(
                "vllm/model_executor/models/llama_eagle3.py",
                330,
                "load_weights",
                "loader.load_weights(model_weights.items())",
            ),
            F(
                "vllm/model_executor/model_loader/weight_utils.py",
                1002,
                "default_weight_loader",
                "assert param.size() == loaded_weight.size(), (",
            ),
        ],
        where="worker",
        shapes=("v1", "interleaved", "truncated"),
    ),
    # ---------------------------------------------------------------- memory
    Scenario(
        "oom-torch",
        "cuda-oom",
        "PyTorch CUDACachingAllocator (torch.OutOfMemoryError) during vllm/v1/worker/gpu_model_runner.py profile_run",
        exc=[
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 3 has a total capacity of 178.35 GiB of which 1.21 GiB is free. Including non-PyTorch memory, this process has 177.12 GiB memory in use. Of the allocated memory 170.02 GiB is allocated by PyTorch, and 5.33 GiB is reserved by PyTorch but unallocated."
        ],
        frames=[
            F(
                "vllm/v1/worker/gpu_model_runner.py",
                3301,
                "profile_run",
                "hidden_states, last_hidden_states = self._dummy_run(",
            ),
            F(
                "torch/nn/modules/module.py",
                1773,
                "_wrapped_call_impl",
                "return self._call_impl(*args, **kwargs)",
            ),
        ],
        where="worker",
        shapes=("v1", "plain", "interleaved", "truncated", "noisy"),
    ),
    Scenario(
        "oom-nccl",
        "cuda-oom",
        "NCCL WARN Cuda failure 'out of memory' then torch DistBackendError (ProcessGroupNCCL)",
        exc=[
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2",
            "ncclUnhandledCudaError: Call to CUDA function failed.",
            "Last error:",
            "Cuda failure 2 'out of memory'",
        ],
        frames=[
            F(
                "vllm/distributed/parallel_state.py",
                1208,
                "init_distributed_environment",
                "torch.distributed.all_reduce(data)",
            )
        ],
        where="worker",
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "kv-v1",
        "kv-cache-too-small",
        "vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory (0.14.0-0.25.0)",
        exc=[
            "ValueError: To serve at least one request with the models's max seq len (262144), (17.16 GiB KV cache is needed, which is larger than the available KV cache memory (9.73 GiB). Based on the available memory, the estimated maximum model length is 148592. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
        ],
        frames=[
            F(
                "vllm/v1/engine/core.py",
                236,
                "_initialize_kv_caches",
                "kv_cache_configs = get_kv_cache_configs(",
            ),
            F(
                "vllm/v1/core/kv_cache_utils.py",
                714,
                "check_enough_kv_cache_memory",
                "raise ValueError(",
            ),
        ],
        shapes=("v1", "plain", "interleaved", "truncated", "noisy"),
    ),
    Scenario(
        "kv-033",
        "kv-cache-too-small",
        "vllm/v1/core/kv_cache_planning.py _check_enough_kv_cache_memory (0.33.0)",
        exc=[
            "ValueError: To serve at least one request with the model's max seq len (131072), (8.00 GiB KV cache is needed, which is larger than the available KV cache memory (5.21 GiB). Based on the available memory, the estimated maximum model length is 85344. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine."
        ],
        frames=[
            F(
                "vllm/v1/core/kv_cache_planning.py",
                80,
                "_check_enough_kv_cache_memory",
                "raise ValueError(",
            )
        ],
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "kv-nomem",
        "kv-cache-no-memory",
        "vllm/v1/core/kv_cache_utils.py (0.10.2-0.25.0), kv_cache_planning.py (0.33.0)",
        exc=[
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
        ],
        frames=[
            F(
                "vllm/v1/core/kv_cache_utils.py",
                688,
                "check_enough_kv_cache_memory",
                "raise ValueError(",
            )
        ],
        shapes=("v1", "plain", "interleaved", "truncated"),
    ),
    Scenario(
        "gpu-util",
        "gpu-memory-utilization-too-high",
        "vllm/v1/worker/utils.py request_memory (0.14.0-0.33.0)",
        exc=[
            "ValueError: Free memory on device cuda:0 (60.12/178.35 GiB) on startup is less than desired GPU memory utilization (0.9, 160.52 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
        ],
        frames=[
            F(
                "vllm/v1/worker/gpu_worker.py",
                236,
                "init_device",
                "self.requested_memory = request_memory(init_snapshot, self.cache_config)",
            ),
            F("vllm/v1/worker/utils.py", 231, "request_memory", "raise ValueError("),
        ],
        where="worker",
        shapes=("v1", "plain", "interleaved", "truncated", "noisy"),
    ),
    Scenario(
        "mem-profiling",
        "memory-profiling-failed",
        "vllm/v1/worker/gpu_worker.py determine_available_memory assert (0.10.2-0.33.0)",
        exc=[
            "AssertionError: Error in memory profiling. Initial free memory 170.2 GiB, current free memory 172.9 GiB. This happens when other processes sharing the same container release GPU memory while vLLM is profiling during initialization. To fix this, ensure consistent GPU memory allocation or isolate vLLM in its own container."
        ],
        frames=[
            F(
                "vllm/v1/worker/gpu_worker.py",
                399,
                "determine_available_memory",
                "assert self.init_snapshot.free_memory >= free_gpu_memory, (",
            )
        ],
        where="worker",
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "max-len",
        "max-model-len-too-large",
        "vllm/config/model.py _get_and_verify_max_len (0.11.0-0.33.0)",
        exc=[
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
            "  Value error, User-specified max_model_len (524288) is greater than the derived max_model_len (max_position_embeddings=262144 or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. [type=value_error, input_value=ArgsKwargs((), {'model': ...}), input_type=ArgsKwargs]",
        ],
        frames=[F("vllm/engine/arg_utils.py", 1288, "create_model_config", "return ModelConfig(")],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    # ---------------------------------------------------------------- parallelism
    Scenario(
        "tp-heads",
        "tp-size-invalid",
        "vllm/config/model.py verify_with_parallel_config (0.10.2-0.33.0)",
        exc=[
            "ValueError: Total number of attention heads (64) must be divisible by tensor parallel size (6)."
        ],
        frames=[
            F("vllm/config/model.py", 1560, "verify_with_parallel_config", "raise ValueError(")
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "tp-ray",
        "tp-size-invalid",
        "vllm/v1/executor/ray_utils.py initialize_ray_cluster (0.10.2-0.33.0)",
        exc=[
            "ValueError: The number of required GPUs exceeds the total number of available GPUs in the placement group. Required number of devices: 16. Total number of devices: 8."
        ],
        frames=[
            F("vllm/v1/executor/ray_utils.py", 351, "initialize_ray_cluster", "raise ValueError(")
        ],
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "pp-missing",
        "pp-layer-mapping-error",
        "vllm/model_executor/models/utils.py PPMissingLayer (0.10.2-0.33.0)",
        exc=["AttributeError: 'PPMissingLayer' object has no attribute 'weight'"],
        frames=[
            F(
                "vllm/model_executor/models/deepseek_v2.py",
                1402,
                "load_weights",
                "param = params_dict[name]",
            )
        ],
        where="worker",
        shapes=("v1", "interleaved", "truncated"),
    ),
    Scenario(
        "pp-not-supported",
        "pp-layer-mapping-error",
        "vllm/config/model.py verify_with_parallel_config (0.10.2-0.33.0)",
        exc=[
            "NotImplementedError: Pipeline parallelism is not supported for this model. Supported models implement the `SupportsPP` interface."
        ],
        frames=[
            F(
                "vllm/config/model.py",
                1573,
                "verify_with_parallel_config",
                "raise NotImplementedError(",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain"),
    ),
    Scenario(
        "nccl-system",
        "nccl-error",
        "PyTorch ProcessGroupNCCL DistBackendError (NCCL ncclSystemError)",
        exc=[
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2",
            "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
            "Last error:",
            "socketStartConnect: Connect to 10.0.0.12<43215> failed : Software caused connection abort",
        ],
        frames=[
            F(
                "vllm/distributed/device_communicators/pynccl.py",
                99,
                "__init__",
                "self.comm: ncclComm_t = self.nccl.ncclCommInitRank(",
            ),
            F(
                "vllm/distributed/device_communicators/pynccl_wrapper.py",
                403,
                "NCCL_CHECK",
                'raise RuntimeError(f"NCCL error: {error_str}")',
            ),
        ],
        where="worker",
        shapes=("v1", "plain", "interleaved", "truncated"),
    ),
    Scenario(
        "nccl-pynccl",
        "nccl-error",
        "vllm/distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK (0.10.2-0.33.0)",
        exc=["RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"],
        frames=[
            F(
                "vllm/distributed/device_communicators/pynccl_wrapper.py",
                403,
                "NCCL_CHECK",
                'raise RuntimeError(f"NCCL error: {error_str}")',
            )
        ],
        where="worker",
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "zmq-bind-cut",
        "port-in-use",
        "vllm/distributed/device_communicators/shm_broadcast.py MessageQueue binding its remote socket (multi-node), traceback cut before the ZMQError",
        where="lines",
        wrapper=False,
        lines=[
            "(Worker_TP12 pid=114) ERROR 11-02 10:20:31 [multiproc_executor.py:898] WorkerProc failed to start.",
            "(Worker_TP12 pid=114) ERROR 11-02 10:20:31 [multiproc_executor.py:898] Traceback (most recent call last):",
            f'(Worker_TP12 pid=114) ERROR 11-02 10:20:31 [multiproc_executor.py:898]   File "{SITE}/vllm/distributed/device_communicators/shm_broadcast.py", line 434, in __init__',
            "(Worker_TP12 pid=114) ERROR 11-02 10:20:31 [multiproc_executor.py:898]     self.remote_socket.bind(socket_addr)",
            f'(Worker_TP12 pid=114) ERROR 11-02 10:20:31 [multiproc_executor.py:898]   File "{SITE}/zmq/sugar/socket.py", line 320, in bind',
            "(Worker_TP12 pid=114) ERROR 11-02 10:20:31 [multiproc_executor.py:898]     super().bind(addr)",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "nccl-watchdog",
        "nccl-timeout",
        "PyTorch ProcessGroupNCCL watchdog",
        where="lines",
        wrapper=False,
        lines=[
            "[rank3]:[E1102 10:31:55.201533620 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4211, OpType=ALLREDUCE, NumelIn=14680064, NumelOut=14680064, Timeout(ms)=600000) ran for 600073 milliseconds before timing out.",
            "[rank3]:[E1102 10:31:55.201876012 ProcessGroupNCCL.cpp:2271] [PG ID 2 PG GUID 3 Rank 3]  failure detected by watchdog at work sequence id: 4211 PG status: last enqueued work: 4211, last completed work: 4210",
            "[rank3]:[E1102 10:31:55.202011331 ProcessGroupNCCL.cpp:670] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
            "[rank3]:[F1102 10:31:55.203122917 ProcessGroupNCCL.cpp:1557] [PG ID 2 PG GUID 3 Rank 3] Process group watchdog thread terminated with exception: [Rank 3] Watchdog caught collective operation timeout",
            "(EngineCore_DP0 pid=1201) ERROR 11-02 10:31:57 [multiproc_executor.py:154] Worker proc VllmWorker-3 died unexpectedly, shutting down executor.",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "shm-nccl",
        "shm-too-small",
        "NCCL transport/shm.cc (NCCL WARN) in a container with 64 MB /dev/shm",
        where="lines",
        wrapper=False,
        lines=[
            "gpu-node-1:1301:1420 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-2SmXy8 to 9637892 bytes",
            "gpu-node-1:1301:1420 [0] NCCL INFO transport/shm.cc:114 -> 2",
            "(Worker_TP0 pid=1301) ERROR 11-02 10:20:31 [multiproc_executor.py:585] WorkerProc failed to start.",
            "(Worker_TP0 pid=1301) ERROR 11-02 10:20:31 [multiproc_executor.py:585] Traceback (most recent call last):",
            '(Worker_TP0 pid=1301) ERROR 11-02 10:20:31 [multiproc_executor.py:585]   File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/pynccl_wrapper.py", line 403, in NCCL_CHECK',
            '(Worker_TP0 pid=1301) ERROR 11-02 10:20:31 [multiproc_executor.py:585]     raise RuntimeError(f"NCCL error: {error_str}")',
            "(Worker_TP0 pid=1301) ERROR 11-02 10:20:31 [multiproc_executor.py:585] RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "shm-torch",
        "shm-too-small",
        "PyTorch torch/multiprocessing shared memory (/dev/shm ENOSPC)",
        exc=[
            "RuntimeError: unable to write to file </torch_1301_3829174622_0>: No space left on device (28)"
        ],
        frames=[
            F(
                "torch/multiprocessing/reductions.py",
                607,
                "reduce_storage",
                "fd, size = storage._share_fd_cpu_()",
            )
        ],
        where="worker",
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "hang-shm",
        "worker-hang",
        "vllm/distributed/device_communicators/shm_broadcast.py (0.12.0+) warning, repeated",
        where="lines",
        wrapper=False,
        lines=[
            "(EngineCore_DP0 pid=1201) WARNING 11-02 11:02:14 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).",
            "(EngineCore_DP0 pid=1201) WARNING 11-02 11:03:14 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).",
            "(EngineCore_DP0 pid=1201) ERROR 11-02 11:05:14 [core.py:851] TimeoutError: RPC call to execute_model timed out.",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "worker-died",
        "worker-died",
        "vllm/v1/executor/multiproc_executor.py worker monitor (0.10.2-0.25.0); killed by the OOM killer",
        where="lines",
        wrapper=False,
        lines=[
            "(EngineCore_DP0 pid=1201) ERROR 11-02 12:40:03 [multiproc_executor.py:154] Worker proc VllmWorker-5 died unexpectedly, shutting down executor.",
            "(EngineCore_DP0 pid=1201) ERROR 11-02 12:40:03 [core.py:851] EngineCore encountered a fatal error.",
            "(APIServer pid=1100) ERROR 11-02 12:40:03 [async_llm.py:480] AsyncLLM output_handler failed.",
            "(APIServer pid=1100) ERROR 11-02 12:40:03 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "worker-died-033",
        "worker-died",
        "vllm/v1/executor/multiproc_executor.py (0.33.0) with exit code",
        where="lines",
        wrapper=False,
        lines=[
            "(EngineCore_DP0 pid=1201) ERROR 11-02 12:40:03 [multiproc_executor.py:380] Worker proc VllmWorker-2 died unexpectedly (exit code: -9), shutting down executor.",
        ],
        shapes=("v1",),
    ),
    Scenario(
        "ray-died",
        "ray-actor-died",
        "Ray ActorDiedError through vllm/v1/executor/ray_executor.py",
        exc=[
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
            "\tclass_name: RayWorkerWrapper",
            "\tactor_id: 5c4c2c7d0e3e0b1e7e52f6a901000000",
            "\tpid: 2211",
            "\tname: _ray_worker_3",
            "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file.",
        ],
        frames=[
            F(
                "vllm/v1/executor/ray_executor.py",
                447,
                "collective_rpc",
                "return ray.get(ray_worker_outputs, timeout=timeout)",
            ),
            F("ray/_private/worker.py", 921, "get_objects", "raise value"),
        ],
        shapes=("v1", "plain", "truncated"),
    ),
    # ---------------------------------------------------------------- environment
    Scenario(
        "driver-old",
        "cuda-driver-mismatch",
        "PyTorch CUDA initialization (c10/cuda)",
        exc=[
            "RuntimeError: The NVIDIA driver on your system is too old (found version 12020). Please update your GPU driver by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your version of the CUDA driver."
        ],
        frames=[F("torch/cuda/__init__.py", 372, "_lazy_init", "torch._C._cuda_init()")],
        where="worker",
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "driver-803",
        "cuda-driver-mismatch",
        "CUDA runtime error 803 via PyTorch",
        exc=[
            "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() that might have already set an error? Error 803: system has unsupported display driver / cuda driver combination"
        ],
        frames=[
            F(
                "torch/cuda/__init__.py",
                1017,
                "device_count",
                "r = torch._C._cuda_getDeviceCount() if nvml_count < 0 else nvml_count",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "arch-kernel",
        "cuda-arch-unsupported",
        "CUDA runtime error 209 via vLLM custom ops",
        exc=[
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        ],
        frames=[
            F(
                "vllm/_custom_ops.py",
                160,
                "rms_norm",
                "torch.ops._C.rms_norm(out, input, weight, epsilon)",
            )
        ],
        where="worker",
        shapes=("v1", "plain", "interleaved", "truncated"),
    ),
    Scenario(
        "arch-sm120",
        "cuda-arch-unsupported",
        "PyTorch torch/cuda/__init__.py _check_capability warning",
        where="lines",
        wrapper=False,
        lines=[
            "/usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py:262: UserWarning: ",
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition with CUDA capability sm_120 is not compatible with the current PyTorch installation.",
            "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.",
        ],
        shapes=("plain",),
    ),
    Scenario(
        "arch-ptxas-blackwell",
        "cuda-arch-unsupported",
        "triton/backends/nvidia/compiler.py make_cubin: Triton's bundled ptxas predates the sm_100 target (its stderr not shown)",
        exc=[
            "subprocess.CalledProcessError: Command '['/usr/local/lib/python3.12/dist-packages/triton/backends/nvidia/bin/ptxas', '-lineinfo', '-v', '--gpu-name=sm_100', '/tmp/tmpat8x27d5.ptx', '-o', '/tmp/tmpat8x27d5.ptx.o']' returned non-zero exit status 255."
        ],
        frames=[
            F(
                "triton/backends/nvidia/compiler.py",
                356,
                "make_cubin",
                "subprocess.run(ptxas_cmd, check=True, close_fds=False, stderr=flog)",
            ),
            F(
                "/usr/lib/python3.12/subprocess.py",
                571,
                "run",
                "raise CalledProcessError(retcode, process.args,",
            ),
        ],
        where="worker",
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "fork",
        "cuda-reinit-in-fork",
        "PyTorch torch/cuda/__init__.py _lazy_init",
        exc=[
            "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method"
        ],
        frames=[
            F(
                "vllm/v1/worker/gpu_worker.py",
                189,
                "init_device",
                "torch.cuda.set_device(self.device)",
            ),
            F("torch/cuda/__init__.py", 358, "_lazy_init", "raise RuntimeError("),
        ],
        where="worker",
        shapes=("v1", "plain", "interleaved", "truncated"),
    ),
    Scenario(
        "no-gpu",
        "no-gpu-visible",
        "PyTorch torch/cuda/__init__.py (no devices visible)",
        exc=["RuntimeError: No CUDA GPUs are available"],
        frames=[
            F(
                "vllm/v1/worker/gpu_worker.py",
                189,
                "init_device",
                "torch.cuda.set_device(self.device)",
            )
        ],
        where="worker",
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "no-device-type",
        "no-gpu-visible",
        "vllm/config/device.py (0.10.2-0.33.0)",
        exc=[
            "RuntimeError: Failed to infer device type, please set the environment variable `VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue."
        ],
        frames=[F("vllm/config/device.py", 55, "__post_init__", "raise RuntimeError(")],
        where="api",
        wrapper=False,
        shapes=("v1", "plain"),
    ),
    Scenario(
        "abi-symbol",
        "install-abi-mismatch",
        "dynamic loader importing vllm/_C.abi3.so built for another torch",
        exc=[
            f"ImportError: {SITE}/vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib"
        ],
        frames=[F("vllm/_custom_ops.py", 13, "<module>", "import vllm._C  # noqa")],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "abi-opnamespace",
        "install-abi-mismatch",
        "torch.ops._C lookup when vllm._C failed to load (vllm/_custom_ops.py)",
        exc=["AttributeError: '_OpNamespace' '_C' object has no attribute 'silu_and_mul'"],
        frames=[F("vllm/_custom_ops.py", 116, "silu_and_mul", "torch.ops._C.silu_and_mul(out, x)")],
        where="worker",
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "compile",
        "torch-compile-failed",
        "PyTorch dynamo BackendCompilerFailed from vllm/compilation/backends.py",
        exc=[
            "torch._dynamo.exc.BackendCompilerFailed: backend='<vllm.compilation.backends.VllmBackend object at 0x7f2c1c2b0e30>' raised:",
            "CalledProcessError: Command '['/usr/bin/gcc', '/tmp/tmpx0l7/cuda_utils.c', '-O3', '-shared', '-fPIC', '-o', '/tmp/tmpx0l7/cuda_utils.cpython-312-x86_64-linux-gnu.so']' returned non-zero exit status 1.",
            "",
            'Set TORCH_LOGS="+dynamo" and TORCHDYNAMO_VERBOSE=1 for more information',
        ],
        frames=[
            F(
                "vllm/compilation/decorators.py",
                439,
                "__call__",
                "output = self.compiled_callable(*args, **kwargs)",
            ),
            F("torch/_dynamo/eval_frame.py", 736, "compile_wrapper", "return fn(*args, **kwargs)"),
        ],
        where="worker",
        shapes=("v1", "plain", "interleaved", "truncated"),
    ),
    Scenario(
        "attn-backend",
        "attention-backend-unsupported",
        "vllm/platforms/cuda.py get_attn_backend_cls (0.12.0+)",
        exc=[
            "ValueError: Selected backend AttentionBackendEnum.FLASHMLA is not valid for this configuration. Reason: ['compute capability not supported', 'block_size not supported']"
        ],
        frames=[
            F(
                "vllm/attention/selector.py",
                112,
                "get_attn_backend",
                "return _cached_get_attn_backend(",
            ),
            F("vllm/platforms/cuda.py", 443, "get_attn_backend_cls", "raise ValueError("),
        ],
        where="worker",
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "attn-invalid",
        "attention-backend-unsupported",
        "vllm/attention/selector.py (0.10.2-0.11.0)",
        exc=[
            "ValueError: Invalid attention backend: 'FLASH_ATTN_VLLM_V1X'. Valid backends are: ['FLASH_ATTN', 'TRITON_ATTN', 'XFORMERS', 'ROCM_FLASH', 'TORCH_SDPA', 'FLASHINFER', 'FLASHMLA', 'CUTLASS_MLA']"
        ],
        frames=[
            F(
                "vllm/attention/selector.py",
                202,
                "get_env_variable_attn_backend",
                "raise ValueError(",
            )
        ],
        where="worker",
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "quant-capability",
        "quantization-unsupported",
        "vllm/config/vllm.py _get_quantization_config (0.10.2-0.33.0)",
        exc=[
            "ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 89. Current capability: 80."
        ],
        frames=[F("vllm/config/vllm.py", 931, "_get_quantization_config", "raise ValueError(")],
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "quant-mismatch",
        "quantization-unsupported",
        "vllm/config/model.py _verify_quantization (0.10.2-0.33.0)",
        exc=[
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
            "  Value error, Quantization method specified in the model config (compressed-tensors) does not match the quantization method specified in the `quantization` argument (awq). [type=value_error, input_value=ArgsKwargs((), {'model': ...}), input_type=ArgsKwargs]",
        ],
        frames=[F("vllm/engine/arg_utils.py", 1288, "create_model_config", "return ModelConfig(")],
        where="api",
        wrapper=False,
        shapes=("v1", "truncated"),
    ),
    # ---------------------------------------------------------------- model and config
    Scenario(
        "arch",
        "architecture-unsupported",
        "vllm/model_executor/models/registry.py _raise_for_unsupported (0.10.2-0.33.0)",
        exc=[
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
            "  Value error, Model architectures ['KimiK25ForConditionalGeneration'] are not supported for now. Supported architectures: dict_keys(['ApertusForCausalLM', 'AquilaModel', 'DeepseekV2ForCausalLM', 'DeepseekV3ForCausalLM']) [type=value_error, input_value=ArgsKwargs((), {'model': ...}), input_type=ArgsKwargs]",
        ],
        frames=[F("vllm/engine/arg_utils.py", 1288, "create_model_config", "return ModelConfig(")],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "arch-transformers",
        "architecture-unsupported",
        "transformers AutoConfig (model type unknown to this transformers)",
        exc=[
            "ValueError: The checkpoint you are trying to load has model type `kimi_k25` but Transformers does not recognize this architecture. This could be because of an issue with the checkpoint, or because your version of Transformers is out of date."
        ],
        frames=[
            F(
                "transformers/models/auto/configuration_auto.py",
                1272,
                "from_pretrained",
                "raise ValueError(",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "inspect",
        "architecture-inspection-failed",
        "vllm/model_executor/models/registry.py (0.10.2-0.33.0)",
        where="lines",
        wrapper=False,
        lines=[
            "(APIServer pid=1100) ERROR 11-02 10:14:20 [registry.py:853] Error in inspecting model architecture 'DeepseekV3ForCausalLM'",
            "(APIServer pid=1100) ERROR 11-02 10:14:20 [registry.py:853] Traceback (most recent call last):",
            f'(APIServer pid=1100) ERROR 11-02 10:14:20 [registry.py:853]   File "{SITE}/vllm/model_executor/models/registry.py", line 1196, in _run_in_subprocess',
            "(APIServer pid=1100) ERROR 11-02 10:14:20 [registry.py:853]     returned.check_returncode()",
            "(APIServer pid=1100) ERROR 11-02 10:14:20 [registry.py:853] subprocess.CalledProcessError: Command '['/usr/bin/python3', '-m', 'vllm.model_executor.models.registry']' returned non-zero exit status 1.",
            "(APIServer pid=1100) Traceback (most recent call last):",
            f'(APIServer pid=1100)   File "{SITE}/vllm/model_executor/models/registry.py", line 1225, in _raise_for_unsupported',
            "(APIServer pid=1100) pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
            "(APIServer pid=1100)   Value error, Model architectures ['DeepseekV3ForCausalLM'] failed to be inspected. Please check the logs for more details. [type=value_error, input_value=ArgsKwargs((), {'model': ...}), input_type=ArgsKwargs]",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "remote-code",
        "trust-remote-code-required",
        "vllm/transformers_utils/config.py (0.10.2-0.33.0)",
        exc=[
            "RuntimeError: Failed to load the model config. If the model is a custom model not yet available in the HuggingFace transformers library, consider setting `trust_remote_code=True` in LLM or using the `--trust-remote-code` flag in the CLI."
        ],
        frames=[
            F(
                "vllm/transformers_utils/config.py",
                190,
                "parse",
                "raise RuntimeError(err_msg) from e",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "chat-template",
        "chat-template-missing",
        "vllm/entrypoints/chat_utils.py (0.10.2-0.13.0) at request time",
        where="lines",
        wrapper=False,
        lines=[
            '(APIServer pid=1100) INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request',
            "(APIServer pid=1100) ERROR 11-02 13:01:44 [serving_chat.py:222] Error in preprocessing prompt inputs",
            "(APIServer pid=1100) ERROR 11-02 13:01:44 [serving_chat.py:222] Traceback (most recent call last):",
            f'(APIServer pid=1100) ERROR 11-02 13:01:44 [serving_chat.py:222]   File "{SITE}/vllm/entrypoints/chat_utils.py", line 1817, in apply_hf_chat_template',
            "(APIServer pid=1100) ERROR 11-02 13:01:44 [serving_chat.py:222]     raise ValueError(",
            "(APIServer pid=1100) ERROR 11-02 13:01:44 [serving_chat.py:222] ValueError: As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if the tokenizer does not define one.",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "hf-gated",
        "hf-auth-failed",
        "huggingface_hub GatedRepoError (HTTP 401)",
        exc=[
            "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-6725f3a1-0d6c1f4e2b7a9c3d1e5f7a9b;7c0b1f3e-4b6d-4e8a-9f2c-1a3b5c7d9e0f)",
            "",
            "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-405B-Instruct/resolve/main/config.json.",
            "Access to model meta-llama/Llama-3.1-405B-Instruct is restricted. You must have access to it and be authenticated to access it. Please log in.",
        ],
        frames=[
            F(
                "huggingface_hub/utils/_http.py",
                426,
                "hf_raise_for_status",
                "raise _format(GatedRepoError, message, response) from e",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "safetensors",
        "checkpoint-corrupt",
        "safetensors SafetensorError via vllm/model_executor/model_loader/weight_utils.py",
        exc=[
            "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer"
        ],
        frames=[
            F(
                "vllm/model_executor/model_loader/weight_utils.py",
                610,
                "safetensors_weights_iterator",
                'with safe_open(st_file, framework="pt") as f:',
            )
        ],
        where="worker",
        shapes=("v1", "plain", "interleaved", "truncated"),
    ),
    Scenario(
        "missing-model-dir",
        "model-not-found",
        "huggingface_hub validate_repo_id via vllm/transformers_utils/repo_utils.py get_model_path (0.10.2-0.33.0, HF_HUB_OFFLINE)",
        exc=[
            "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/Kimi-K2.5'. Use `repo_type` argument if needed."
        ],
        frames=[
            F(
                "vllm/transformers_utils/repo_utils.py",
                220,
                "get_model_path",
                "return snapshot_download(repo_id=model, **common_kwargs)",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "no-weights",
        "checkpoint-corrupt",
        "vllm/model_executor/model_loader/default_loader.py (0.10.2-0.33.0)",
        exc=["RuntimeError: Cannot find any model weights with `/models/Kimi-K2.5`"],
        frames=[
            F(
                "vllm/model_executor/model_loader/default_loader.py",
                155,
                "_prepare_weights",
                "raise RuntimeError(",
            )
        ],
        where="worker",
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "disk",
        "disk-full",
        "OS ENOSPC while huggingface_hub downloads into the cache",
        exc=[
            "OSError: [Errno 28] No space left on device: '/root/.cache/huggingface/hub/models--moonshotai--Kimi-K2.5/blobs/3f9a.incomplete'"
        ],
        frames=[
            F("huggingface_hub/file_download.py", 1727, "_download_to_tmp_and_move", "http_get(")
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    # ---------------------------------------------------------------- server
    Scenario(
        "port-uvicorn",
        "port-in-use",
        "uvicorn server startup via vllm/entrypoints/launcher.py serve_http",
        where="lines",
        wrapper=False,
        lines=[
            "(APIServer pid=1100) INFO:     Started server process [1100]",
            "(APIServer pid=1100) INFO:     Waiting for application startup.",
            "(APIServer pid=1100) INFO:     Application startup complete.",
            "(APIServer pid=1100) ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8001): address already in use",
            "(APIServer pid=1100) INFO:     Waiting for application shutdown.",
            "(APIServer pid=1100) INFO:     Application shutdown complete.",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "port-socket",
        "port-in-use",
        "Python socket.bind in vllm/entrypoints/openai/api_server.py create_server_socket",
        exc=["OSError: [Errno 98] Address already in use"],
        frames=[
            F(
                "vllm/entrypoints/openai/api_server.py",
                1870,
                "create_server_socket",
                "sock.bind(addr)",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "engine-dead",
        "engine-dead",
        "vllm/v1/engine/exceptions.py EngineDeadError (0.10.2-0.33.0), after start-up",
        where="lines",
        wrapper=False,
        pre=["(APIServer pid=1100) INFO:     Application startup complete."],
        lines=[
            "(EngineCore_DP0 pid=1201) ERROR 11-02 14:22:10 [core.py:851] EngineCore encountered a fatal error.",
            "(APIServer pid=1100) ERROR 11-02 14:22:10 [async_llm.py:480] AsyncLLM output_handler failed.",
            "(APIServer pid=1100) ERROR 11-02 14:22:10 [async_llm.py:480] Traceback (most recent call last):",
            f'(APIServer pid=1100) ERROR 11-02 14:22:10 [async_llm.py:480]   File "{SITE}/vllm/v1/engine/core_client.py", line 887, in get_output_async',
            "(APIServer pid=1100) ERROR 11-02 14:22:10 [async_llm.py:480]     raise self._format_exception(outputs) from None",
            "(APIServer pid=1100) ERROR 11-02 14:22:10 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "engine-init",
        "engine-init-failed",
        "vllm/v1/engine/utils.py wait_for_engine_startup (0.10.2-0.33.0), root cause not captured",
        where="lines",
        wrapper=False,
        lines=[
            "(APIServer pid=1100) Traceback (most recent call last):",
            '(APIServer pid=1100)   File "/usr/local/bin/vllm", line 10, in <module>',
            "(APIServer pid=1100)     sys.exit(main())",
            f'(APIServer pid=1100)   File "{SITE}/vllm/v1/engine/utils.py", line 880, in wait_for_engine_startup',
            "(APIServer pid=1100)     raise RuntimeError(",
            "(APIServer pid=1100) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': -9}",
        ],
        shapes=("v1", "plain"),
    ),
    # ---------------------------------------------------------------- time-outs, nodes, exits
    Scenario(
        "timeout",
        "load-timeout",
        "vllm/v1/engine/core_client.py (0.17.0+)",
        exc=[
            "TimeoutError: Timed out waiting for engine core processes to start. This is often caused by slow weight loading for large models. Waited 600s (configured by VLLM_ENGINE_READY_TIMEOUT_S). To increase the timeout, set the environment variable: VLLM_ENGINE_READY_TIMEOUT_S=<seconds>"
        ],
        frames=[
            F(
                "vllm/v1/engine/core_client.py",
                764,
                "_wait_for_engine_startup",
                "raise TimeoutError(",
            )
        ],
        where="api",
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "gloo-interface",
        "network-interface-wrong",
        "PyTorch gloo transport, vllm-project/vllm:docs/usage/troubleshooting.md (Incorrect network setup)",
        exc=[
            "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"
        ],
        frames=[
            F(
                "vllm/distributed/parallel_state.py",
                1414,
                "init_distributed_environment",
                "torch.distributed.init_process_group(",
            ),
        ],
        where="worker",
        shapes=("v1", "plain"),
    ),
    Scenario(
        "ray-duplicate-ip",
        "node-ip-duplicate",
        "vllm/v1/executor/ray_executor.py _init_workers_ray (0.10.2-0.33.0)",
        exc=[
            "RuntimeError: Every node should have a unique IP address. Got 2 nodes with node ids ['a1', 'b2'] and 1 unique IP addresses {'10.0.0.5'}. Please check your network configuration. If you set `VLLM_HOST_IP` environment variable, make sure it is unique for each node."
        ],
        frames=[
            F("vllm/v1/executor/ray_executor.py", 308, "_init_workers_ray", "raise RuntimeError("),
        ],
        where="core",
        shapes=("v1", "plain"),
    ),
    Scenario(
        "dp-headless-handshake",
        "node-join-timeout",
        "vllm/v1/engine/core.py EngineCoreProc.startup_handshake (0.10.2-0.33.0; a headless engine waits HANDSHAKE_TIMEOUT_MINS = 5 for the head's front-end)",
        exc=["RuntimeError: Did not receive response from front-end process within 5 minutes"],
        frames=[
            F(
                "vllm/v1/engine/core.py",
                1012,
                "startup_handshake",
                "raise RuntimeError(",
            ),
        ],
        wrapper=False,
        shapes=("v1", "plain", "truncated"),
    ),
    Scenario(
        "ray-placement-group-wait",
        "node-join-timeout",
        "vllm/v1/executor/ray_utils.py _wait_until_pg_ready (0.11.1-0.33.0; PG_WAIT_TIMEOUT = 1800)",
        exc=[
            "ValueError: Cannot provide a placement group requiring 16 GPUs (placement_group_specs=[{'node:10.0.0.5': 0.001, 'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}, {'GPU': 1.0}]) within 1800 seconds.",
            "Tensor parallel size may exceed available GPUs in your cluster. Check resources with `ray status` and `ray list nodes`.",
        ],
        frames=[
            F("vllm/v1/executor/ray_utils.py", 314, "_wait_until_pg_ready", "raise ValueError("),
        ],
        shapes=("v1", "truncated"),
    ),
    Scenario(
        "exited",
        "process-exited",
        "Linux shell/OOM killer: the process is SIGKILLed",
        where="lines",
        wrapper=False,
        lines=[
            "Loading safetensors checkpoint shards:  62% Completed | 40/64 [15:10<09:06, 22.8s/it]",
            "Killed",
        ],
        shapes=("plain",),
    ),
    Scenario(
        "segfault",
        "process-exited",
        "CPython faulthandler (native crash in an extension)",
        where="lines",
        wrapper=False,
        lines=[
            "Fatal Python error: Segmentation fault",
            "",
            "Thread 0x00007f3a1d7fe640 (most recent call first):",
            f'  File "{SITE}/vllm/model_executor/layers/fused_moe/fused_moe.py", line 1210 in fused_experts_impl',
        ],
        shapes=("plain",),
    ),
    Scenario(
        "unknown",
        "unrecognized-error",
        "an exception no rule knows (vllm/v1/worker/gpu_model_runner.py)",
        exc=["IndexError: index 163840 is out of bounds for dimension 0 with size 163840"],
        frames=[
            F(
                "vllm/v1/worker/gpu_model_runner.py",
                2410,
                "execute_model",
                "logits = self.model.compute_logits(sample_hidden_states)",
            )
        ],
        shapes=("v1", "plain", "truncated"),
    ),
    # ---------------------------------------------------------------- serving features (issue 24)
    Scenario(
        "cli-unrecognized",
        "cli-args-invalid",
        "argparse ArgumentParser.error via vllm/utils/argparse_utils.py FlexibleArgumentParser (exit 2; 0.10.2-0.33.0)",
        where="lines",
        wrapper=False,
        lines=[
            "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...",
            "vllm: error: unrecognized arguments: --speculative-model /models/drafter",
        ],
        shapes=("plain",),
    ),
    Scenario(
        "tool-parser-choice",
        "tool-call-parser-error",
        "argparse choices of --tool-call-parser (vllm/entrypoints/openai/cli_args.py, 0.10.2-0.11.x)",
        where="lines",
        wrapper=False,
        lines=[
            "usage: vllm serve [model_tag] [options]",
            "vllm serve: error: argument --tool-call-parser: invalid choice: 'kimi_k25' (choose from 'deepseek_v3', 'hermes', 'kimi_k2', 'llama3_json', 'mistral', 'pythonic', 'qwen3_coder')",
        ],
        shapes=("plain",),
    ),
    Scenario(
        "tool-parser-extract",
        "tool-call-parser-error",
        "vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py extract_tool_calls logger.exception (0.10.2-0.25.0)",
        where="lines",
        wrapper=False,
        lines=[
            '(APIServer pid=1100) INFO:     127.0.0.1:40112 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
            "(APIServer pid=1100) ERROR 11-02 10:40:01 [hermes_tool_parser.py:157] Error in extracting tool call from response.",
            "(APIServer pid=1100) ERROR 11-02 10:40:01 [hermes_tool_parser.py:157] Traceback (most recent call last):",
            f'(APIServer pid=1100) ERROR 11-02 10:40:01 [hermes_tool_parser.py:157]   File "{SITE}/vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py", line 134, in extract_tool_calls',
            "(APIServer pid=1100) ERROR 11-02 10:40:01 [hermes_tool_parser.py:157]     function_call_arr = json.loads(match[0] if match[0] else match[1])",
            "(APIServer pid=1100) ERROR 11-02 10:40:01 [hermes_tool_parser.py:157] json.decoder.JSONDecodeError: Expecting value: line 1 column 2 (char 1)",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "jinja-render",
        "chat-template-render-failed",
        "jinja2 raised in transformers render_jinja_template under vllm/entrypoints/chat_utils.py apply_hf_chat_template (0.10.2-0.16.0)",
        where="lines",
        wrapper=False,
        lines=[
            "(APIServer pid=1100) ERROR 11-02 10:41:07 [serving_chat.py:257] Error in preprocessing prompt inputs",
            "(APIServer pid=1100) ERROR 11-02 10:41:07 [serving_chat.py:257] Traceback (most recent call last):",
            f'(APIServer pid=1100) ERROR 11-02 10:41:07 [serving_chat.py:257]   File "{SITE}/vllm/entrypoints/chat_utils.py", line 1567, in apply_hf_chat_template',
            "(APIServer pid=1100) ERROR 11-02 10:41:07 [serving_chat.py:257]     return tokenizer.apply_chat_template(",
            f'(APIServer pid=1100) ERROR 11-02 10:41:07 [serving_chat.py:257]   File "{SITE}/transformers/utils/chat_template_utils.py", line 521, in render_jinja_template',
            "(APIServer pid=1100) ERROR 11-02 10:41:07 [serving_chat.py:257]     rendered_chat = compiled_template.render(",
            "(APIServer pid=1100) ERROR 11-02 10:41:07 [serving_chat.py:257] jinja2.exceptions.UndefinedError: 'dict object' has no attribute 'content'",
        ],
        shapes=("v1", "plain"),
    ),
    Scenario(
        "lora-rank",
        "lora-limit-exceeded",
        "vllm/lora/peft_helper.py PEFTHelper.validate_legal (0.10.2-0.33.0)",
        exc=["ValueError: LoRA rank 64 is greater than max_lora_rank 16."],
        frames=[
            F(
                "vllm/lora/worker_manager.py",
                122,
                "_load_adapter",
                "peft_helper.validate_legal(self.lora_config)",
            ),
            F(
                "vllm/lora/peft_helper.py",
                127,
                "validate_legal",
                "raise ValueError(f\"{' '.join(error_msg)}\")",
            ),
        ],
        where="worker",
    ),
    Scenario(
        "sampler-nan",
        "sampling-nan",
        "PyTorch torch.multinomial under vllm/v1/sample/ops/topk_topp_sampler.py random_sample",
        exc=["RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"],
        frames=[
            F(
                "vllm/v1/sample/ops/topk_topp_sampler.py",
                188,
                "random_sample",
                "return probs.div_(q).argmax(dim=-1).view(-1)",
            ),
        ],
        where="worker",
        wrapper=False,
    ),
    Scenario(
        "weight-keyerror",
        "checkpoint-weight-mismatch",
        "vllm/model_executor/models/qwen2.py load_weights (param = params_dict[name]) on a checkpoint tensor the model lacks",
        exc=["KeyError: 'layers.0.mlp.down_proj.weight_scale'"],
        frames=[
            F(
                "vllm/model_executor/models/utils.py",
                291,
                "load_weights",
                'autoloaded_weights = set(self._load_module("", self.module, weights))',
            ),
            F(
                "vllm/model_executor/models/qwen2.py",
                471,
                "load_weights",
                "param = params_dict[name]",
            ),
        ],
        where="worker",
    ),
    Scenario(
        "weight-shape",
        "checkpoint-weight-mismatch",
        "vllm/model_executor/model_loader/weight_utils.py default_weight_loader (0.10.2-0.33.0)",
        exc=[
            "AssertionError: Attempted to load weight (torch.Size([3600])) into parameter (torch.Size([3584]))"
        ],
        frames=[
            F(
                "vllm/model_executor/model_loader/weight_utils.py",
                1023,
                "default_weight_loader",
                "assert param.size() == loaded_weight.size(), (",
            ),
        ],
        where="worker",
    ),
]

# ------------------------------------------------------------------------------ rendering

PRE = [
    ("APIServer", "INFO", "api_server.py:1839", "vLLM API server version 0.17.0"),
    (
        "APIServer",
        "INFO",
        "utils.py:238",
        "non-default args: {'model_tag': '/models/Kimi-K2.5', 'model': '/models/Kimi-K2.5', 'trust_remote_code': True, 'tensor_parallel_size': 8, 'port': 8001, 'speculative_config': {'method': 'eagle3', 'model': '/models/kimi-k25-eagle3', 'num_speculative_tokens': 3}}",
    ),
    ("APIServer", "INFO", "model.py:531", "Resolved architecture: KimiK25ForConditionalGeneration"),
    ("APIServer", "INFO", "model.py:1554", "Using max model len 262144"),
    (
        "EngineCore_DP0",
        "INFO",
        "core.py:93",
        "Initializing a V1 LLM engine (v0.17.0) with config: model='/models/Kimi-K2.5', speculative_config=SpeculativeConfig(method='eagle3', model='/models/kimi-k25-eagle3', num_spec_tokens=3), tokenizer='/models/Kimi-K2.5', skip_tokenizer_init=False, dtype=torch.bfloat16, max_seq_len=262144, tensor_parallel_size=8, pipeline_parallel_size=1, quantization=compressed-tensors, enforce_eager=False",
    ),
    (
        "Worker_TP0",
        "INFO",
        "parallel_state.py:1208",
        "rank 0 in world size 8 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0",
    ),
    (
        "Worker_TP0",
        "INFO",
        "gpu_model_runner.py:4256",
        "Starting to load model /models/Kimi-K2.5...",
    ),
]
POST_LOAD = [
    ("Worker_TP0", "INFO", "default_loader.py:294", "Loading weights took 412.51 seconds"),
    (
        "Worker_TP0",
        "INFO",
        "gpu_model_runner.py:4339",
        "Model loading took 71.93 GiB memory and 415.234101 seconds",
    ),
]
PIDS = {
    "APIServer": 1100,
    "EngineCore_DP0": 1201,
    "Worker_TP0": 1301,
    "Worker_TP1": 1302,
    "Worker_TP2": 1303,
    "Worker_TP3": 1304,
}
STAMP = "11-02 10:15:01"


def prefixed(proc: str | None, level: str | None, where: str | None, msg: str) -> str:
    out = ""
    if proc:
        out += f"({proc} pid={PIDS.get(proc, 1999)}) "
    if level:
        out += f"{level} {STAMP} [{where}] "
    return out + msg


def traceback_lines(frames: list[tuple[str, int, str, str]], exc: list[str]) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        full = f"{SITE}/{path}" if not path.startswith("/") else path
        lines.append(f'  File "{full}", line {line}, in {func}')
        lines.append(f"    {code}")
    return lines + exc


def render(sc: Scenario, shape: str) -> list[str]:
    proc_prefix = shape != "plain"
    out: list[str] = []

    def P(proc: str, level: str | None, where: str | None, msg: str) -> str:
        return prefixed(proc if proc_prefix else None, level, where, msg)

    if shape != "truncated":
        for proc, level, where, msg in PRE:
            out.append(P(proc, level, where, msg))
        out.extend(sc.pre if proc_prefix else [strip_proc(x) for x in sc.pre])
    if sc.where == "lines":
        body = sc.lines if proc_prefix else [strip_proc(x) for x in sc.lines]
        out.extend(body)
        return out
    tb = traceback_lines(sc.frames, sc.exc)
    if shape == "truncated":
        # the tail of the traceback only: cut after the header and the first frame
        keep = tb[3:] if len(tb) > 4 else tb[1:]
        proc = (
            "EngineCore_DP0"
            if sc.where == "engine"
            else ("Worker_TP0" if sc.where == "worker" else "APIServer")
        )
        return [P(proc, "ERROR", "core.py:851", x) for x in keep[-6:]]
    if sc.where == "api":
        out.extend(P("APIServer", None, None, x) for x in tb)
        return out
    if sc.where == "worker":
        workers = (
            ["Worker_TP0", "Worker_TP1", "Worker_TP2", "Worker_TP3"]
            if shape == "interleaved"
            else ["Worker_TP0"]
        )
        blocks = []
        for w in workers:
            blk = [P(w, "ERROR", "multiproc_executor.py:811", "WorkerProc failed to start.")]
            blk += [P(w, "ERROR", "multiproc_executor.py:811", x) for x in tb]
            blocks.append(blk)
        if shape == "interleaved":
            rng = random.Random(sc.name)
            idx = [0] * len(blocks)
            while any(i < len(b) for i, b in zip(idx, blocks, strict=True)):
                choices = [k for k, b in enumerate(blocks) if idx[k] < len(b)]
                k = rng.choice(choices)
                out.append(blocks[k][idx[k]])
                idx[k] += 1
        else:
            out.extend(blocks[0])
        out.append(P("EngineCore_DP0", "ERROR", "core.py:708", "EngineCore failed to start."))
        out.append(
            P("EngineCore_DP0", "ERROR", "core.py:708", "Traceback (most recent call last):")
        )
        out.append(
            P(
                "EngineCore_DP0",
                "ERROR",
                "core.py:708",
                "Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.",
            )
        )
    else:  # engine
        for proc, level, where, msg in POST_LOAD:
            out.append(P(proc, level, where, msg))
        out.append(P("EngineCore_DP0", "ERROR", "core.py:708", "EngineCore failed to start."))
        eng = traceback_lines(ENGINE_FRAMES + sc.frames, sc.exc)
        out.extend(P("EngineCore_DP0", "ERROR", "core.py:708", x) for x in eng)
        out.append(P("EngineCore_DP0", None, None, "Process EngineCore_DP0:"))
        out.extend(
            P("EngineCore_DP0", None, None, x)
            for x in traceback_lines(
                [
                    (
                        "/usr/lib/python3.12/multiprocessing/process.py",
                        314,
                        "_bootstrap",
                        "self.run()",
                    )
                ],
                sc.exc,
            )
        )
    if sc.wrapper:
        api = traceback_lines(
            API_FRAMES,
            [
                "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
            ],
        )
        out.extend(P("APIServer", None, None, x) for x in api)
    return out


_PROC = re.compile(r"^\([A-Za-z_][\w\-]* pid=\d+\) ")


def strip_proc(line: str) -> str:
    return _PROC.sub("", line)


def noisy(lines: list[str]) -> list[str]:
    """ANSI colours, CI timestamps, a carriage-return progress bar, folding at 120 columns."""
    out = [
        "\r".join(
            f"Loading safetensors checkpoint shards: {p:3d}% Completed | {p * 64 // 100}/64"
            for p in (0, 25, 50, 100)
        )
    ]
    for i, line in enumerate(lines):
        line = line.replace("ERROR ", "\x1b[1;31mERROR\x1b[0m ", 1).replace(
            "INFO ", "\x1b[32mINFO\x1b[0m ", 1
        )
        stamp = f"2025-11-02T10:15:{i % 60:02d}.{i:07d}Z "
        full = stamp + line
        visible = re.sub(r"\x1b\[[0-9;]*m", "", full)
        if len(visible) <= 120:
            out.append(full)
            continue
        # fold the visible text at 120 columns (colour codes dropped on folded lines)
        out.extend(visible[k : k + 120] for k in range(0, len(visible), 120))
    return out


def build() -> dict[str, dict[str, str]]:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.log"):
        old.unlink()
    labels: dict[str, dict[str, str]] = {}
    for sc in SCENARIOS:
        for shape in sc.shapes:
            base = "v1" if shape == "noisy" else shape
            lines = render(sc, base)
            if shape == "noisy":
                lines = noisy(lines)
            name = f"{sc.id}--{sc.name}--{shape}.log"
            (OUT / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
            labels[name] = {"id": sc.id, "shape": shape, "source": sc.source}
    (HERE / "labels.json").write_text(json.dumps(labels, indent=1, sort_keys=True) + "\n")
    return labels


if __name__ == "__main__":
    got = build()
    print(f"wrote {len(got)} logs to {OUT}")

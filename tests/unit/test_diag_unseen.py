"""Issue 24: diagnosis that holds on unseen logs -- CLI rejections, causes above the
generic wrappers, frame-based inference, healthy lines with error words, and the shapes
logs come in (newest first, kubectl/compose prefixes, escaped and caret ANSI, boxed
viewers, quotes, lines retyped in lower case). Lines are built from vLLM's own messages."""

# ruff: noqa: E501  (real vLLM lines are long)

from __future__ import annotations

import pytest

from fleet.diagnosis import diagnose, diagnoses_exit_code

E = "(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] "
SITE = "/usr/local/lib/python3.12/dist-packages"


def ids(lines: list[str]) -> list[str]:
    return [d.id for d in diagnose(lines)]


def frames(*fs: tuple[str, str, str], prefix: str = E) -> list[str]:
    out = []
    for path, func, code in fs:
        out += [prefix + f'  File "{SITE}/{path}", line 10, in {func}', prefix + f"    {code}"]
    return out


# ------------------------------------------------------------------ the command line


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["vllm: error: unrecognized arguments: --omni"], "cli-args-invalid"),
        (
            [
                "usage: vllm serve [model_tag] [options]",
                "vllm serve: error: the following arguments are required: model_tag",
            ],
            "cli-args-invalid",
        ),
        (
            ["api_server.py: error: argument --max-model-len: invalid int value: '32k'"],
            "cli-args-invalid",
        ),
        (
            [
                "vllm serve: error: argument --tool-call-parser: invalid choice: 'glm45' (choose from 'deepseek_v3', 'hermes')"
            ],
            "tool-call-parser-error",
        ),
    ],
)
def test_every_argparse_rejection_is_a_fatal_start_up_error(
    lines: list[str], expected: str
) -> None:
    got = diagnose(lines)
    assert got[0].id == expected
    assert got[0].severity == "fatal" and diagnoses_exit_code(got) == 1


def test_a_usage_line_alone_is_not_an_error() -> None:
    assert diagnose(["usage: vllm serve [model_tag] [options]"]) == []


# ------------------------------------------------------------------ causes above wrappers


def test_an_unknown_exception_before_engine_dead_is_the_answer() -> None:
    lines = [
        E + "RuntimeError: sample_tokens called without pending output from execute_model",
        "(APIServer pid=1) ERROR 11-02 10:15:02 [async_llm.py:480] AsyncLLM output_handler failed.",
        "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
    ]
    got = diagnose(lines)
    assert [d.id for d in got][:2] == ["unrecognized-error", "engine-dead"]
    assert got[0].evidence[0].text.startswith("RuntimeError: sample_tokens")


def test_a_known_cause_inside_a_worker_wrapper_names_itself() -> None:
    line = (
        E
        + "RuntimeError: Worker failed with error 'LoRA rank 32 is greater than max_lora_rank 16.', please check the stack trace above for the root cause"
    )
    got = diagnose([line])[0]
    assert got.id == "lora-limit-exceeded"
    assert got.values["rank"] == "32" and got.fix == "--max-lora-rank 32"


# ------------------------------------------------------------------ frames without a message


def test_kv_cache_frames_name_the_kv_cache() -> None:
    lines = frames(
        (
            "vllm/v1/core/kv_cache_utils.py",
            "get_kv_cache_configs",
            "_check_enough_kv_cache_memory(",
        ),
        ("vllm/v1/core/kv_cache_utils.py", "_check_enough_kv_cache_memory", "raise ValueError("),
    )
    got = diagnose(lines)[0]
    assert got.id == "kv-cache-too-small" and got.confidence == "medium"


def test_compile_and_ray_frames_name_their_cause_at_low_confidence() -> None:
    compile_ = frames(
        (
            "vllm/compilation/backends.py",
            "compile",
            "compiled_graph, handle = self.compiler.compile(",
        ),
        ("torch/_inductor/compile_fx.py", "compile_fx", "return aot_autograd("),
    )
    got = diagnose(compile_)[0]
    assert (got.id, got.confidence) == ("torch-compile-failed", "low")
    ray = frames(
        ("vllm/v1/executor/ray_executor_v2.py", "_init_executor", "ray.get(init_worker_refs)"),
        ("ray/_private/worker.py", "get", "values, debugger_breakpoint = worker.get_objects("),
    )
    got = diagnose(ray)[0]
    assert (got.id, got.confidence) == ("ray-actor-died", "low")


def test_a_bare_timeout_in_the_broadcast_queue_is_a_worker_hang() -> None:
    lines = [
        E + "Traceback (most recent call last):",
        *frames(
            (
                "vllm/v1/executor/multiproc_executor.py",
                "get_response",
                "status, result = mq.dequeue(timeout=dequeue_timeout)",
            ),
            (
                "vllm/distributed/device_communicators/shm_broadcast.py",
                "acquire_read",
                "raise TimeoutError",
            ),
        ),
        E + "TimeoutError",
        E + "EngineCore encountered a fatal error.",
    ]
    got = diagnose(lines)
    assert got[0].id == "worker-hang"
    assert got[0].evidence[0].text == "TimeoutError"


def test_a_keyerror_in_load_weights_is_a_checkpoint_mismatch() -> None:
    lines = [
        *frames(
            ("vllm/model_executor/models/qwen2.py", "load_weights", "param = params_dict[name]")
        ),
        E + "KeyError: 'model.norm.weight_scale_inv'",
    ]
    assert ids(lines)[0] == "checkpoint-weight-mismatch"
    # a layer missing on a pipeline-parallel rank is not a weight
    assert ids([E + "KeyError: 'model.layers.20.self_attn.attn'"])[0] == "pp-layer-mapping-error"


def test_a_failing_tool_parser_and_chat_template_from_frames() -> None:
    tool = [
        "Traceback (most recent call last):",
        '  File "/app/hermes_tool_parser.py", line 228, in extract_tool_calls_streaming',
        '    function_name: Union[str, None] = current_tool_call.get("name")',
        "AttributeError: 'NoneType' object has no attribute 'get'",
    ]
    assert ids(tool)[0] == "tool-call-parser-error"
    chat = [
        "ERROR 04-08 07:13:28 [serving_chat.py:198] Error in preprocessing prompt inputs",
        *frames(
            (
                "vllm/entrypoints/chat_utils.py",
                "apply_hf_chat_template",
                "return tokenizer.apply_chat_template(",
            ),
            prefix="ERROR 04-08 07:13:28 [serving_chat.py:198] ",
        ),
        'ERROR 04-08 07:13:28 [serving_chat.py:198] TypeError: can only concatenate str (not "list") to str',
    ]
    got = diagnose(chat)[0]
    assert got.id == "chat-template-render-failed" and got.severity == "error"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0",
            "sampling-nan",
        ),
        (
            "jinja2.exceptions.TemplateError: Conversation roles must alternate user/assistant/user/assistant/...",
            "chat-template-render-failed",
        ),
        (
            "RuntimeError: Number of requested LoRAs (4) is greater than the number of GPU LoRA slots (1).",
            "lora-limit-exceeded",
        ),
        (
            "AssertionError: Tried to load weights of size torch.Size([3096576, 1])to a parameter of size torch.Size([5376, 1152])",
            "checkpoint-weight-mismatch",
        ),
        (
            "KeyError: 'invalid tool call parser: openai (chose from { hermes })'",
            "tool-call-parser-error",
        ),
    ],
)
def test_new_ids_from_their_raise_sites(line: str, expected: str) -> None:
    assert ids([E + line])[0] == expected


# ------------------------------------------------------------------ healthy lines stay clean


@pytest.mark.parametrize(
    "lines",
    [
        [
            "h100-2:413:413 [1] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared object file: No such file or directory : when loading libnccl-net.so",
            "node2: node2:841:841 [3] NCCL INFO Failed to open libibverbs.so[.1]",
        ],
        [
            'INFO:     127.0.0.1:55504 - "GET / HTTP/1.1" 404 Not Found',
            '(APIServer pid=1) INFO:     10.0.0.3:4410 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request',
        ],
        [
            "(APIServer pid=1) WARNING 01-28 09:40:16 [async_omni.py:218] No LLM stage found, processors will not be available. This may cause issues with OpenAIServingModels.",
            "WARNING 01-21 01:28:57 cache_engine.py:96] Using 'pin_memory=False' as WSL is detected. This may slow down the performance.",
        ],
    ],
)
def test_info_and_warning_lines_with_error_words_are_never_fatal_on_their_own(
    lines: list[str],
) -> None:
    assert diagnoses_exit_code(diagnose(lines)) == 0


def test_a_warning_that_relays_an_exception_still_counts() -> None:
    line = "WARNING 06-13 11:42:20 _custom_ops.py:11] Failed to import from vllm._C with ImportError('/x/vllm/_C.abi3.so: undefined symbol: _ZN5torch7LibraryC1E')"
    got = diagnose([line])
    assert got[0].id == "install-abi-mismatch" and diagnoses_exit_code(got) == 1


def test_a_warning_cause_is_fatal_once_the_log_has_an_error() -> None:
    warn = "(APIServer pid=1) WARNING 01-28 09:40:16 [utils.py:1] Failed to import from vllm._C: undefined symbol: _ZN5torch7Library"
    err = E + "Traceback (most recent call last):"
    assert diagnoses_exit_code(diagnose([warn, err])) == 1


# ------------------------------------------------------------------ shapes


KV = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."


@pytest.mark.parametrize(
    "line",
    [
        f"2026-04-28T14:17:50.089230833+08:00 {E}{KV}",  # kubectl logs --timestamps
        f"vllm03  | {E}{KV}",  # docker compose
        f"#033[1;36m(EngineCore_DP0 pid=7)#033[0;0m ERROR 11-02 10:15:01 [core.py:708] {KV}",  # syslog
        f"^[[1;36m(EngineCore_DP0 pid=7)^[[0;0m ERROR 11-02 10:15:01 [core.py:708] {KV}^M",  # caret ANSI
        f"│ {E}{KV}    │",  # boxed viewer
        f"> {E}{KV}",  # markdown quote
        KV.lower(),  # retyped in lower case
    ],
)
def test_shapes_seen_in_the_wild(line: str) -> None:
    assert ids([line])[0] == "kv-cache-no-memory"


def test_records_joined_by_caret_m_are_separate_lines() -> None:
    p = "^[[1;36m(APIServer pid=6)^[[0;0m ERROR 08-22 21:36:14 [serving_chat.py:250] "
    line = (
        f"{p}Traceback (most recent call last):^M{p}"
        f'  File "{SITE}/vllm/entrypoints/chat_utils.py", line 1290, in apply_hf_chat_template^M'
    )
    assert (
        ids([line, f"{p}    return tokenizer.apply_chat_template(^M"])[0]
        == "chat-template-render-failed"
    )


def test_a_log_printed_newest_first_is_read_bottom_up() -> None:
    upright = [
        E + "EngineCore failed to start.",
        E + "Traceback (most recent call last):",
        *frames(
            (
                "vllm/v1/engine/core.py",
                "_initialize_kv_caches",
                "kv_cache_configs = get_kv_cache_configs(",
            ),
            (
                "vllm/v1/core/kv_cache_utils.py",
                "_check_enough_kv_cache_memory",
                "raise ValueError(",
            ),
        ),
        E + "           ^^^^^^^^^^^^^^^^^",
        E + KV,
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    down = list(reversed(upright))
    got = diagnose(down)
    assert got[0].id == "kv-cache-no-memory"
    assert got[0].evidence[0].line == 2  # the line number in the reversed paste
    assert [d.id for d in diagnose(upright)] == [d.id for d in got]

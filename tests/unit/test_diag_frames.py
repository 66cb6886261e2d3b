"""Frame-aware evidence: a traceback cut before its exception line is still diagnosed, from
the string literal of the ``raise`` it stopped at or from its deepest known frame, at medium
confidence; the message itself gives high confidence, generic wrappers low."""

# ruff: noqa: E501  (real vLLM lines are long)

from __future__ import annotations

import pytest

from fleet.diagnosis import diagnose
from fleet.diagnosis.catalogue import load_catalogue, template_patterns
from fleet.diagnosis.engine import raise_text

P = "(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] "
SITE = "/usr/local/lib/python3.12/dist-packages/vllm"


def tb(*frames: tuple[str, str, str]) -> list[str]:
    out = [P + "Traceback (most recent call last):"]
    for path, func, code in frames:
        out += [P + f'  File "{SITE}/{path}", line 10, in {func}', P + f"    {code}"]
    return out


def test_raise_literal_of_a_cut_traceback_names_the_cause() -> None:
    lines = tb(
        ("v1/engine/core.py", "__init__", "self._initialize_kv_caches(vllm_config)"),
        (
            "v1/core/kv_cache_utils.py",
            "check_enough_kv_cache_memory",
            'raise ValueError("No available memory for the cache blocks. "',
        ),
    )
    got = diagnose(lines)
    assert got[0].id == "kv-cache-no-memory"
    assert got[0].confidence == "medium"
    assert got[0].evidence[0].text.startswith("raise ValueError")


def test_deepest_known_frame_names_the_cause_when_the_raise_has_no_literal() -> None:
    lines = tb(
        ("v1/engine/core.py", "_initialize_kv_caches", "check_enough_kv_cache_memory("),
        ("v1/core/kv_cache_utils.py", "check_enough_kv_cache_memory", "raise ValueError("),
    )
    got = diagnose(lines)
    assert [d.id for d in got][:1] == ["kv-cache-too-small"]
    assert got[0].confidence == "medium"
    assert got[0].values["frame"] == "kv_cache_utils.py:check_enough_kv_cache_memory"


def test_frame_rules_walk_up_to_the_deepest_frame_they_know() -> None:
    lines = tb(
        (
            "v1/worker/gpu_worker.py",
            "init_device",
            "init_worker_distributed_environment(self.vllm_config)",
        ),
        (
            "distributed/parallel_state.py",
            "initialize_model_parallel",
            "_TP = init_model_parallel_group(",
        ),
        ("distributed/some_helper.py", "helper", "x = y()"),
    )
    assert diagnose(lines)[0].id == "nccl-error"


def test_an_exception_line_closes_the_traceback() -> None:
    lines = [
        *tb(("v1/core/kv_cache_utils.py", "check_enough_kv_cache_memory", "raise ValueError(")),
        P + "ValueError: something no rule knows",
    ]
    got = diagnose(lines)
    assert [d.id for d in got] == ["unrecognized-error"]  # no frame guess once the message is shown
    assert got[0].confidence == "low"


def test_windows_paths_and_unknown_frames() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "E:\\env\\Lib\\site-packages\\vllm\\v1\\engine\\core_client.py", line 465, in __init__',
        "    self.input_socket = self.resources.input_socket = make_zmq_socket(",
    ]
    assert diagnose(lines)[0].id == "port-in-use"
    unknown = diagnose(
        ["Traceback (most recent call last):", '  File "/x/y.py", line 1, in z', "    q()"]
    )
    assert [d.id for d in unknown] == ["unrecognized-error"]


def test_confidence_levels_and_contract() -> None:
    high = diagnose(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."])[0]
    assert (high.id, high.confidence) == ("cuda-oom", "high")
    assert high.as_contract()["confidence"] == "high"
    low = diagnose([P + "RuntimeError: Engine core initialization failed. See root cause above."])[
        0
    ]
    assert (low.id, low.confidence) == ("engine-init-failed", "low")
    mid = diagnose(["Worker proc VllmWorker-3 died unexpectedly, shutting down executor."])[0]
    assert (mid.id, mid.confidence) == ("worker-died", "medium")


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (
            'raise ValueError("No available memory " "for the cache blocks.")',
            "ValueError: No available memory for the cache blocks.",
        ),
        (
            "raise RuntimeError(f'Free memory on device ({free}/{total} GiB) on startup')",
            "RuntimeError: Free memory on device ({free}/{total} GiB) on startup",
        ),
        (
            'assert x > y, ("Error in memory profiling. "',
            "AssertionError: Error in memory profiling.",
        ),
        ("raise ValueError(", None),
        ("return foo('not a raise line')", None),
    ],
)
def test_raise_text(code: str, text: str | None) -> None:
    assert raise_text(code) == text


def test_templates_match_by_literal_runs_not_exception_names() -> None:
    cat = load_catalogue()
    assert {
        p.rule.id for p in template_patterns(cat, "AssertionError: pass {k} should be callable")
    } == set()
    ids = {
        p.rule.id
        for p in template_patterns(
            cat,
            "ValueError: Free memory on device ({free}/{total} GiB) on startup is less than desired GPU memory utilization ({util}, {req} GiB).",
        )
    }
    assert ids == {"gpu-memory-utilization-too-high"}


def test_generic_runs_do_not_identify_a_message() -> None:
    """ " is only supported for " or " is not supported" occur in the raise sites of many
    unrelated causes: a template sharing only such words with a pattern maps to nothing."""
    cat = load_catalogue()
    for text in (
        "ValueError: disable_any_whitespace is only supported for xgrammar and guidance backends.",
        "ValueError: HiSparse is only supported for DSA models with index_topk.",
        "NotImplementedError: {x} is not supported yet for {y}.",
    ):
        assert template_patterns(cat, text) == [], text


def test_an_exception_line_cut_short_is_read_from_its_raise() -> None:
    """A paste that cuts the exception line mid-message: the ``raise`` shown in the deepest
    frame carries the whole literal, and the cut line is that raise's message."""
    lines = [
        *tb(
            ("v1/engine/core_client.py", "_wait_for_engine_startup", "wait_for_engine_startup("),
            (
                "v1/utils.py",
                "wait_for_engine_startup",
                'raise RuntimeError("Engine core initialization failed. "',
            ),
        ),
        P + "RuntimeError: Engine core ini",
    ]
    got = diagnose(lines)
    assert [d.id for d in got] == ["engine-init-failed"]
    assert got[0].confidence == "medium"
    assert [e.text for e in got[0].evidence][:2] == [
        "RuntimeError: Engine core ini",
        'raise RuntimeError("Engine core initialization failed. "',
    ]
    other = [*lines[:-1], P + "RuntimeError: something else entirely"]
    assert [d.id for d in diagnose(other)] == ["unrecognized-error"]  # not that raise's message


def test_a_wrapper_relaying_output_at_info_does_not_hide_a_traceback() -> None:
    head = "2025-06-27 12:57:51,690 - __main__ - INFO - "
    lines = [
        head + "Traceback (most recent call last):",
        head
        + f'  File "{SITE}/v1/core/kv_cache_utils.py", line 714, in check_enough_kv_cache_memory',
        head + "    raise ValueError(",
        head
        + "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
    ]
    got = diagnose(lines)
    assert (got[0].id, got[0].confidence) == ("kv-cache-no-memory", "high")
    own = "(EngineCore_DP0 pid=7) INFO 11-02 10:15:01 [core.py:708] "
    assert diagnose([own + "ValueError: a message vLLM logged at INFO"]) == []


@pytest.mark.parametrize(
    "frames",
    [
        (
            (
                "distributed/device_communicators/shm_broadcast.py",
                "__init__",
                "self.remote_socket.bind(socket_addr)",
            ),
            ("../zmq/sugar/socket.py", "bind", "super().bind(addr)"),
        ),
        (
            (
                "distributed/device_communicators/shm_broadcast.py",
                "__init__",
                "self.remote_socket.bind(socket_addr)",
            ),
        ),
    ],
)
def test_a_traceback_cut_in_a_zmq_bind_is_an_address_in_use(
    frames: tuple[tuple[str, str, str], ...],
) -> None:
    got = diagnose(tb(*frames))
    assert (got[0].id, got[0].confidence) == ("port-in-use", "medium")

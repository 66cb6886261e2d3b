"""Never a false clean: a log is clean only when it has no error-level line, no traceback,
no exception line and no fatal marker -- whatever prefixes surround them.

The property test generates logs from healthy vLLM lines (every header shape of
``fleet.diagnosis.normalize.SHAPES``) and, optionally, error signals that match no rule
(random messages, truncated tracebacks, API error bodies, fatal markers). With a signal the
answer must hold a problem (fatal/error) diagnosis; without one it must be empty.
"""

# ruff: noqa: E501  (real vLLM lines are long)

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.diagnosis import diagnose, diagnoses_exit_code
from fleet.diagnosis.scan import diagnose_file

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

HEALTHY = [
    "(APIServer pid=1) INFO 11-02 10:22:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s",
    '(APIServer pid=1) INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK',
    "INFO 11-02 10:14:01 [__init__.py:216] Automatically detected platform cuda.",
    "(EngineCore_DP0 pid=7) INFO 2026-04-25 10:01:17.340 [core.py:93] Initializing a V1 LLM engine",
    "Loading safetensors checkpoint shards:  45% Completed | 29/64 [01:02<01:15,  2.15s/it]",
    "(Worker_TP3 pid=9) WARNING 11-02 10:20:00 [fp8.py:12] Using default MoE config. Performance might be sub-optimal!",
    "(RayWorkerWrapper pid=77, ip=10.0.0.2) INFO 11-02 10:20:00 [worker.py:1] Loading weights",
    "INFO:     Application startup complete.",
    "",
]
# Outer prefixes a collector / CI / issue paste puts in front of every line.
OUTER = [
    "",
    "> ",
    ">   | ",
    "2025-09-28T15:47:24.1234567Z ",
    "vllm-1  | ",
    "[pod/vllm-0/vllm] ",
    "Sep 28 15:47:24 gpu-01 vllm[1234]: ",
    "  12 | ",
    "[rank0]: ",
    "_bk;t=1727531244123",
    "#033[1;36m",  # rsyslog's escaped ANSI colour code
    "2025-06-27 12:57:51,690 - __main__ - INFO - ",  # a launcher relaying output at INFO
]
# Headers that make a line error-level.
ERROR_HEADERS = [
    "(EngineCore_DP0 pid=68) ERROR 09-28 15:47:24 [core.py:718] ",
    "(APIServer pid=1) (EngineCore_DP0 pid=68) ERROR 2026-04-25 10:01:17.340 [file.py:246] ",
    "ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] ",
    "ERROR:    ",
    "[E ProcessGroupNCCL.cpp:563] ",
    "2024-07-01 07:28:04.488 1 kserve ERROR [__main__.py:<module>():254] ",
    "2025-09-28 15:47:24,123 - vllm.engine - ERROR - ",
    "(RayWorkerWrapper pid=2211, ip=10.0.0.12) CRITICAL 05-06 14:20:15 [core.py:387] ",
    "2026-06-09 14:01:52.982 [Error] (Process) ",
    "#033[1;36m(VllmWorker TP2 pid=415)#033[0;0m ERROR 08-31 04:18:45 [multiproc_executor.py:559] ",
]
# How an issue paste may wrap a one-line signal (Markdown emphasis, inline code).
WRAPS = ["{}", "**{}**", "`{}`"]
EXC_TYPES = [
    "ValueError",
    "RuntimeError",
    "AssertionError",
    "KeyError",
    "TypeError",
    "NameError",
    "vllm.some.module.WeirdError",
    "torch._dynamo.exc.Unsupported",
    "Exception",
    "ray.exceptions.RayTaskError(ZzError)",
]
FATAL = [
    "Segmentation fault (core dumped)",
    "Fatal Python error: Aborted",
    "*** SIGSEGV received at time=1700000000 on cpu 3 ***",
    "terminate called after throwing an instance of 'c10::Error'",
]

WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=9)
MESSAGE = st.lists(WORDS, min_size=3, max_size=8).map(" ".join)


@st.composite
def signal(draw: st.DrawFn) -> list[str]:
    """Lines carrying one error signal no catalogue rule explains."""
    kind = draw(
        st.sampled_from(["error-line", "exception", "truncated", "json", "fatal", "pydantic"])
    )
    msg = draw(MESSAGE)
    head = draw(st.sampled_from(ERROR_HEADERS))
    wrap = draw(st.sampled_from(WRAPS))
    if kind == "error-line":
        return [wrap.format(head + f"zz {msg}")]
    if kind == "exception":
        return [wrap.format(f"{draw(st.sampled_from(EXC_TYPES))}: zz {msg}")]
    if kind == "pydantic":  # a validation error's detail line, pasted without its exception
        return [f"  Value error, zz {msg} [type=value_error, input_value=ArgsKwargs((), {{}})]"]
    if kind == "json":
        body = {
            "object": "error",
            "message": f"zz {msg}",
            "type": "InternalServerError",
            "code": 500,
        }
        return [json.dumps(body)]
    if kind == "fatal":
        return [draw(st.sampled_from(FATAL))]
    frames = draw(st.integers(min_value=1, max_value=4))
    out = ["Traceback (most recent call last):"]
    for i in range(frames):
        out += [
            f'  File "/usr/lib/python3.12/site-packages/zz{msg.split()[0]}/m{i}.py", line {10 + i}, in f{i}',
            f"    g{i}(x)",
        ]
    if draw(st.booleans()):
        out.append("    raise ZzError(")  # cut at the raise line: no exception line at all
    return out


@st.composite
def log(draw: st.DrawFn, with_signal: bool) -> list[str]:
    outer = draw(st.sampled_from(OUTER))
    lines = [outer + h for h in draw(st.lists(st.sampled_from(HEALTHY), max_size=40))]
    if with_signal:
        at = draw(st.integers(min_value=0, max_value=len(lines)))
        sig = [outer + s for s in draw(signal())]
        lines[at:at] = sig
    if draw(st.booleans()):
        lines = [x + "\r" for x in lines]  # CRLF endings
    return lines


@SETTINGS
@given(log(with_signal=True))
def test_a_log_with_an_error_signal_is_never_clean(lines: list[str]) -> None:
    found = diagnose(lines)
    assert diagnoses_exit_code(found) == 1, (lines, [(d.id, d.severity) for d in found])
    assert found[0].evidence, found[0]


@SETTINGS
@given(log(with_signal=False))
def test_a_log_without_error_signals_is_clean(lines: list[str]) -> None:
    assert diagnose(lines) == []


@SETTINGS
@given(log(with_signal=True))
def test_the_file_scanner_is_never_falsely_clean_either(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str]
) -> None:
    path = tmp_path_factory.mktemp("sig") / "x.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert diagnoses_exit_code(diagnose_file(path).diagnoses) == 1


def test_unrecognized_error_evidence_prefers_the_exception_then_the_error_line() -> None:
    got = diagnose(
        [
            "(EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:1] something odd happened here",
            "Traceback (most recent call last):",
            '  File "/x/zz/a.py", line 3, in f',
            "    g()",
            "ZzWeirdError: the real message",
        ]
    )
    assert [d.id for d in got] == ["unrecognized-error"]
    assert got[0].evidence[0].text == "ZzWeirdError: the real message"
    assert got[0].confidence == "low"
    only_line = diagnose(["ERROR 09-28 15:47:24 [core.py:1] something odd happened here"])
    assert only_line[0].evidence[0].line == 1
    frame_only = diagnose(['  File "/x/zz/a.py", line 3, in f', "    g()"])
    assert frame_only[0].evidence[0].text.startswith('File "/x/zz/a.py"')


def test_benign_error_lines_stay_clean() -> None:
    assert (
        diagnose(
            [
                "(APIServer pid=1) ERROR 11-02 11:33:19 [serving_chat.py:222] ValueError: This model's maximum context length is 262144 tokens.",
                "ERROR:    Exception in ASGI application",
            ]
        )[0].id
        == "unrecognized-error"
    )  # a request-level error line that no rule excuses...
    assert (
        diagnose(
            [
                "(APIServer pid=1) ERROR 11-02 11:33:19 [serving_chat.py:222] ValueError: This model's maximum context length is 262144 tokens.",
            ]
        )
        == []
    )  # ...but one the catalogue excuses as benign does not count


def test_empty_and_healthy_logs(tmp_path: Path) -> None:
    assert diagnose([]) == []
    assert diagnose(HEALTHY) == []

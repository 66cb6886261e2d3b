"""Line normalisation: prefixes of vLLM, CI systems, terminals and log collectors."""

# ruff: noqa: E501  (real vLLM messages are long lines)

from __future__ import annotations

import json

import pytest

from fleet.diagnosis.normalize import fold_width, normalize, visible

MSG = "ValueError: No available memory for the cache blocks."


@pytest.mark.parametrize(
    ("raw", "proc", "level"),
    [
        (
            f"(EngineCore_DP0 pid=17374) ERROR 09-28 15:47:24 [core.py:718] {MSG}",
            "EngineCore_DP0",
            "ERROR",
        ),
        (
            f"(Worker_TP3 pid=9) ERROR 09-28 15:47:24 [multiproc_executor.py:811] {MSG}",
            "Worker_TP3",
            "ERROR",
        ),
        (f"(APIServer pid=1) {MSG}", "APIServer", None),
        (f"ERROR 09-28 15:47:24 [core.py:718] {MSG}", None, "ERROR"),
        # pre-0.6 format without the opening bracket
        (f"ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] {MSG}", None, "ERROR"),
        # DEBUG file paths shortened with "..."
        (f"WARNING 09-28 15:47:24 [model_executor/.../fp8_utils.py:12] {MSG}", None, "WARNING"),
        (
            f"(RayWorkerWrapper pid=2211, ip=10.0.0.12) ERROR 05-06 14:20:15 [core.py:387] {MSG}",
            "RayWorkerWrapper",
            "ERROR",
        ),
        (f"(pid=77) {MSG}", "pid77", None),
        (
            f"(VllmWorkerProcess pid=232) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] {MSG}",
            "VllmWorkerProcess",
            "ERROR",
        ),
        (f"ERROR:    {MSG}", None, "ERROR"),
        (
            f"2025-09-28T15:47:24.1234567Z (EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:1] {MSG}",
            "EngineCore_DP0",
            "ERROR",
        ),
        (f"[2025-09-28 15:47:24] {MSG}", None, None),
        (f"  123 | (EngineCore_DP0 pid=1) {MSG}", "EngineCore_DP0", None),
        (
            f"vllm-1  | (EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:1] {MSG}",
            "EngineCore_DP0",
            "ERROR",
        ),
        (f"Sep 28 15:47:24 gpu-01 vllm[1234]: {MSG}", None, None),
        (f"[pod/vllm-0/vllm] {MSG}", None, None),
        (
            f"(EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:1] {MSG} [repeated 7x across cluster]",
            "EngineCore_DP0",
            "ERROR",
        ),
    ],
)
def test_prefixes_are_stripped(raw: str, proc: str | None, level: str | None) -> None:
    n = normalize(raw)
    assert n.text == MSG
    assert n.proc == proc
    assert n.level == level


def test_traceback_indentation_survives() -> None:
    raw = '(EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:718]   File "/x/core.py", line 1, in f'
    assert normalize(raw).text == '  File "/x/core.py", line 1, in f'


def test_ansi_and_carriage_returns() -> None:
    raw = f"\x1b[36m(EngineCore_DP0 pid=1)\x1b[0m \x1b[1;31mERROR\x1b[0m 09-28 15:47:24 [core.py:1] {MSG}"
    assert normalize(raw).text == MSG
    bar = "Loading: 10%|#   | 1/10\rLoading: 50%|#####| 5/10\rLoading: 100%|##########| 10/10\r"
    assert visible(bar) == "Loading: 100%|##########| 10/10"
    assert normalize(f"Loading 3%\r{MSG}\n").text == MSG


def test_json_logging_takes_message_and_exc_info() -> None:
    raw = json.dumps(
        {
            "asctime": "x",
            "levelname": "ERROR",
            "message": "EngineCore failed to start.",
            "exc_info": f"Traceback (most recent call last):\n{MSG}",
        }
    )
    assert normalize(raw).text.splitlines()[-1] == MSG


def test_control_characters_removed() -> None:
    assert normalize(f"\x00\x07{MSG}").text == MSG


def test_fold_width_detects_terminal_wrapping() -> None:
    text = "(EngineCore_DP0 pid=1) ERROR 09-28 15:47:24 [core.py:1] " + "ValueError: boom " * 30
    folded = [text[i : i + 80] for i in range(0, len(text), 80)]
    lines = ["INFO 09-28 15:47:24 [a.py:1] short"] * 5 + folded * 3
    assert fold_width(lines) == 80
    # identical full-length records are not a folded log
    same = ["(APIServer pid=1) INFO 11-02 10:22:00 [loggers.py:123] Engine 000: x" * 2] * 40
    assert fold_width(same) is None
    # an unfolded log: long lines of many lengths
    assert fold_width(["x" * (50 + (i * 7) % 90) for i in range(200)]) is None
    assert fold_width([]) is None


# --------------------------------------------------------------------------- header shapes

from fleet.diagnosis.normalize import SHAPES, HeaderShape, strip_prefixes  # noqa: E402

SHAPE_EXAMPLES = [(s, ex) for s in SHAPES for ex in s.examples]


def test_every_shape_has_examples_and_a_unique_name() -> None:
    names = [s.name for s in SHAPES]
    assert len(names) == len(set(names))
    assert all(s.examples for s in SHAPES), [s.name for s in SHAPES if not s.examples]


@pytest.mark.parametrize(
    ("shape", "example"),
    SHAPE_EXAMPLES,
    ids=[f"{s.name}-{i}" for s in SHAPES for i, _ in enumerate(s.examples)],
)
def test_header_shape_examples(
    shape: HeaderShape, example: tuple[str, str, str | None, str | None]
) -> None:
    raw, text, proc, level = example
    n = normalize(raw)
    assert (n.text, n.proc, n.level) == (text, proc, level)
    # the example really exercises its shape: the shape's regex matches at some stage of
    # the stripping (on the visible raw line or after an earlier prefix came off)
    stage = visible(raw)
    hit = False
    for _ in range(8):
        if shape.pattern.match(stage):
            hit = True
            break
        nxt = strip_prefixes(stage).text
        # take one prefix off at a time: the first shape that matches
        for other in SHAPES:
            m = other.pattern.match(stage)
            if m and m.end() > 0:
                stage = stage[m.end() :]
                break
        else:
            stage = nxt
    assert hit, f"{shape.name}: no stage of {raw!r} matches its regex"


@pytest.mark.parametrize(
    "raw",
    [
        f"{MSG}^M",
        f"{MSG}\r",
        f"\x1b_bk;t=1727531244123\x07{MSG}",
        f"[36m(RayWorkerWrapper pid=1)[0m ERROR 09-28 15:47:24 [core.py:1] {MSG}",
        f"\x1b[1;31m> 2025-09-28T15:47:24Z vllm-1  | (APIServer pid=1) (EngineCore_DP0 pid=68) ERROR 09-28 15:47:24 [core.py:1] {MSG}",
        # rsyslog escapes control characters: "#033[..m" colour codes, "#015" for CR
        f"#033[1;36m(VllmWorker TP2 pid=415)#033[0;0m ERROR 08-31 04:18:45 [multiproc_executor.py:559] {MSG}#015",
        # Markdown emphasis / inline code around a pasted line
        f"**(Worker_TP4_EP4 pid=2532) ERROR 12-29 15:21:11 [multiproc_executor.py:751] {MSG}**",
        f"`{MSG}`",
        f"```{MSG}```",
    ],
)
def test_pasted_line_endings_and_orphan_colour_codes(raw: str) -> None:
    assert normalize(raw).text == MSG


def test_the_level_says_which_shape_gave_it() -> None:
    """vLLM's own INFO header marks a healthy line; a wrapper's INFO (a launcher relaying a
    child's output) does not hide an exception line it carries."""
    own = normalize(f"(EngineCore_DP0 pid=1) INFO 09-28 15:47:24 [core.py:1] {MSG}")
    assert (own.level, own.level_shape) == ("INFO", "vllm-logger")
    relayed = normalize(f"2025-06-27 12:57:51,690 - __main__ - INFO - {MSG}")
    assert (relayed.text, relayed.level, relayed.level_shape) == (
        MSG,
        "INFO",
        "python-logging-dashes",
    )
    both = normalize(
        f"2025-06-27 12:57:51,690 - __main__ - INFO - ERROR 09-28 15:47:24 [c.py:1] {MSG}"
    )
    assert (both.level, both.level_shape) == ("ERROR", "vllm-logger")


def test_api_error_bodies_read_as_exceptions() -> None:
    body = '{"object":"error","message":"CUDA out of memory. Tried to allocate 2.00 GiB.","type":"InternalServerError","param":null,"code":500}'
    assert (
        normalize(body).text
        == "InternalServerError: CUDA out of memory. Tried to allocate 2.00 GiB."
    )
    openai = 'Error: {"error": {"message": "boom happened", "type": "server_error", "code": 500}}'
    assert normalize(openai).text == "ServerError: boom happened"
    docker = json.dumps({"log": f"{MSG}\n", "stream": "stderr", "time": "2025-09-28T15:47:24Z"})
    assert normalize(docker).text == MSG

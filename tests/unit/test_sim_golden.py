"""Golden transcripts: the rehearsal vLLM's successful start, line by line, by shape.

For vLLM 0.15.1, 0.17.0 and 0.18.0 the expected transcript is assembled here from the real
wheels, independently of the simulator's code: the sequence of a successful EAGLE-3 start
of Kimi-K2.5 on 8 GPUs is the one docs/research/vllm-serve.md §1.3 documents (which process
prints what, how many times, in which order), and each line's file basename, call-start
line number, level and message template are read from that version's source with
``ast`` in this test. Every physical line of the simulator's log is then compared: process
prefixes (names, nesting by family, one pid per process), header, basename, line number,
message template; tqdm's weight bars (``\\r`` + the wheel's ``_BAR_FORMAT``, 0..N, 100%
twice, then a prefix-only line) and the CUDA-graph bars (one physical line of
``\\r``-separated updates) byte for byte in shape; the logo (6 physical lines, ``\\r``
endings) from the wheel's template; uvicorn's lines. The 0.15.1 and 0.17.0 trees are
patched with fleet's patch engine (unpatched they stop at config time, see
test_sim_paths.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from sim_harness import make_home, patched_tree, run_sim, serve_args, shape_of

from fleet.sandbox.vllm_source import vllm_tree
from tests.versions import SIM_GOLDEN

VERSIONS = list(SIM_GOLDEN)
LEVELS = {"info": "INFO", "info_once": "INFO", "warning": "WARNING", "debug": "DEBUG"}


def _calls(path: Path) -> list[tuple[int, str, str]]:
    """(call-start line, level, format) of every logger call with a literal format, or
    with a parameter whose default is the format (``message: str = "..."``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for fn in [tree, *[n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]]:
        defaults: dict[str, str] = {}
        if isinstance(fn, ast.FunctionDef):
            params = fn.args.args[len(fn.args.args) - len(fn.args.defaults) :]
            for param, default in zip(params, fn.args.defaults, strict=True):
                if isinstance(default, ast.Constant) and isinstance(default.value, str):
                    defaults[param.arg] = default.value
        for node in ast.walk(fn):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LEVELS
                and node.args
            ):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                out.append((node.lineno, LEVELS[node.func.attr], first.value))
            elif isinstance(first, ast.Name) and first.id in defaults:
                out.append((node.lineno, LEVELS[node.func.attr], defaults[first.id]))
    return sorted(set(out))


def wheel_message(root: Path, rel: str, fragment: str) -> tuple[str, int, str]:
    """(basename, call-start line, format) of the INFO call in ``rel`` logging
    ``fragment``, read from the wheel."""
    found = [c for c in _calls(root / "vllm" / rel) if fragment in c[2] and c[1] != "DEBUG"]
    assert found, f"{rel}: no INFO call logging {fragment!r}"
    line, _level, fmt = found[0]
    return rel.rsplit("/", 1)[-1], line, fmt


def template_regex(fmt: str) -> re.Pattern[str]:
    out, last = [], 0
    for m in re.finditer(r"%(?:\.\d+)?[sdf]", fmt):
        out.append(re.escape(fmt[last : m.start()]))
        out.append({"s": r".*?", "d": r"-?\d+"}.get(m.group(0)[-1], r"[\d.]+"))
        last = m.end()
    out.append(re.escape(fmt[last:]))
    return re.compile("^" + "".join(out) + "$", re.S)


def bar_regex(bar_format: str, desc: str) -> re.Pattern[str]:
    """tqdm's line for the wheel's ``_BAR_FORMAT`` (fields as tqdm fills them)."""
    fields = {
        "desc": re.escape(desc),
        "percentage:3.0f": r"(?P<pct>[ \d]{3})",
        "n_fmt": r"(?P<n>\d+)",
        "total_fmt": r"(?P<total>\d+)",
        "elapsed": r"\d\d:\d\d",
        "remaining": r"(?:\d\d:\d\d|\?)",
        "rate_fmt": r"(?:\?it/s|[ \d]+\.\d\d(?:it/s|s/it))",
    }
    out, last = [], 0
    for m in re.finditer(r"\{([^}]+)\}", bar_format):
        out.append(re.escape(bar_format[last : m.start()]))
        out.append(fields[m.group(1)])
        last = m.end()
    out.append(re.escape(bar_format[last:].rstrip("\n")))
    return re.compile("^" + "".join(out) + "$")


def graph_regex(desc: str) -> re.Pattern[str]:
    return re.compile(
        "^" + re.escape(desc) + r": +(?P<pct>\d+)%\|(?P<bar>.{10})\| (?P<n>\d+)/(?P<total>\d+) "
        r"\[\d\d:\d\d<(?:\d\d:\d\d|\?), (?:\?it/s|[ \d]+\.\d\d(?:it/s|s/it))\] *$"
    )


def module_string(root: Path, rel: str, name: str) -> str:
    tree = ast.parse((root / "vllm" / rel).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise AssertionError(f"{rel}: no {name}")


def logo(root: Path) -> tuple[int, str]:
    """(line of the logo's lgr.info, the monochrome template) of entrypoints/utils.py."""
    tree = ast.parse((root / "vllm" / "entrypoints/utils.py").read_text(encoding="utf-8"))
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "log_version_and_model":
            template = None
            line = None
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name == "Template":
                        arg = node.args[0]
                        assert isinstance(arg, ast.Constant)
                        template = re.sub(r"\$\{[a-z]\}", "", str(arg.value))
                    if name == "info":
                        line = node.lineno
            assert template and line
            return line, template
    raise AssertionError("no log_version_and_model")


def family(version: str) -> dict[str, Any]:
    """Prefix facts per family (docs/research/vllm-serve.md §1.1 table)."""
    minor = int(version.split(".")[1])
    colour = ""
    if minor < 16:
        colour = module_string(vllm_tree(version), "utils/system_utils.py", "CYAN")
    return {
        "colour": colour,
        "engine": "EngineCore" if minor >= 18 else "EngineCore_DP0",
        "early": ("Worker",) if minor >= 17 else (),
        "late": (lambda k: ("Worker", f"Worker_TP{k}"))
        if minor == 17
        else (lambda k: (f"Worker_TP{k}",)),
        "server": "Starting vLLM server on %s"
        if minor >= 18
        else "Starting vLLM API server %d on %s",
    }


def expected(version: str, root: Path) -> list[dict[str, Any]]:
    """The successful start, step by step (docs/research/vllm-serve.md §1.3): who prints
    (A APIServer, E EngineCore, W0 TP rank 0, W every worker), what."""
    fam = family(version)
    steps: list[dict[str, Any]] = [{"kind": "logo"}]

    def log(who: str, rel: str, fragment: str, phase: str = "late") -> None:
        steps.append(
            {"kind": "log", "who": who, "msg": wheel_message(root, rel, fragment), "phase": phase}
        )

    log("A", "entrypoints/utils.py", "non-default args: %s")
    for _model in ("target", "drafter"):
        log("A", "config/model.py", "Resolved architecture: %s")
        log("A", "config/model.py", "Using max model len %s")
    log("A", "config/scheduler.py", "Chunked prefill is enabled")
    log("A", "config/vllm.py", "Asynchronous scheduling is %s.")
    log("E", "v1/engine/core.py", "Initializing a V1 LLM engine")
    if "DP group leader" in (root / "vllm/v1/executor/multiproc_executor.py").read_text():
        log("E", "v1/executor/multiproc_executor.py", "DP group leader")
    log("W", "distributed/parallel_state.py", "distributed_init_method=%s backend=%s", "early")
    log("W0", "distributed/device_communicators/pynccl.py", "vLLM is using nccl", "early")
    log("W", "distributed/parallel_state.py", "is assigned as DP rank", "early")
    log("W0", "v1/worker/gpu_model_runner.py", "Starting to load model %s...")
    log("W0", "platforms/cuda.py", "attention backend out of potential backends")
    moe = "model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe.py"
    log("W", moe, "Using CompressedTensorsWNA16MarlinMoEMethod")
    steps.append({"kind": "bar", "total": 64})
    log("W0", "model_executor/model_loader/default_loader.py", "Loading weights took")
    log("W", "v1/worker/gpu_model_runner.py", "Loading drafter model...")
    log("W0", "platforms/cuda.py", "attention backend out of potential backends")
    steps.append({"kind": "bar", "total": 1})
    log("W0", "model_executor/model_loader/default_loader.py", "Loading weights took")
    log("W", "v1/spec_decode/eagle.py", "with distinct embed_tokens weights")
    log("W", "v1/spec_decode/eagle.py", "with distinct lm_head weights")
    log("W0", "v1/worker/gpu_model_runner.py", "Model loading took")
    log("W", "v1/worker/gpu_model_runner.py", "Encoder cache will be initialized")
    for _part in ("backbone", "eagle_head"):
        log("W0", "compilation/backends.py", "for vLLM's torch.compile")
        log("W0", "compilation/backends.py", "Dynamo bytecode transform time")
        log("W0", "compilation/backends.py", "Compiling a graph for compile range")
    log(
        "W0",
        "compilation/monitor.py",
        "torch.compile took" if version >= "0.18" else "torch.compile takes",
    )
    if version >= "0.18":
        log("W0", "compilation/monitor.py", "Initial profiling/warmup run took")
    log("W0", "v1/worker/gpu_worker.py", "Available KV cache memory")
    log("E", "v1/core/kv_cache_utils.py", "GPU KV cache size: %s tokens")
    log("E", "v1/core/kv_cache_utils.py", "Maximum concurrency for %s tokens")
    steps.append({"kind": "graphs", "kind_mode": ("mixed prefill-decode", "PIECEWISE")})
    steps.append({"kind": "graphs", "kind_mode": ("decode", "FULL")})
    log("W0", "v1/worker/gpu_model_runner.py", "Graph capturing finished")
    log("E", "v1/engine/core.py", "init engine (profile, create kv cache, warmup model)")
    log("A", "entrypoints/openai/api_server.py", "Supported tasks: %s")
    log("A", "entrypoints/openai/api_server.py", fam["server"])
    log("A", "entrypoints/launcher.py", "Available routes are:")
    steps.append(
        {
            "kind": "routes",
            "msg": wheel_message(root, "entrypoints/launcher.py", "Route: %s, Methods: %s"),
        }
    )
    for text in (
        "INFO:     Started server process [%d]",
        "INFO:     Waiting for application startup.",
        "INFO:     Application startup complete.",
    ):
        steps.append({"kind": "raw", "who": "A", "fmt": text})
    return steps


class Checker:
    def __init__(
        self, version: str, root: Path, lines: list[str], api_pid: int, model: str
    ) -> None:
        self.version = version
        self.model = model
        self.root = root
        self.lines = lines
        self.i = 0
        self.fam = family(version)
        self.api_pid = api_pid
        self.engine_pid: int | None = None
        self.worker_pids: dict[int, int] = {}

    def next(self) -> str:
        assert self.i < len(self.lines), f"transcript ends early at line {self.i + 1}"
        line = self.lines[self.i]
        self.i += 1
        shape = shape_of(line)
        # 0.13-0.15 colour the prefix in files too (unless NO_COLOR); 0.16+ only on a tty
        assert set(shape.colours) <= {self.fam["colour"]}, self.where()
        return line

    def where(self) -> str:
        return f"line {self.i}: {self.lines[self.i - 1][:200]!r}"

    def prefixes(self, who: str, rank: int, phase: str) -> tuple[str, ...]:
        if who == "A":
            return ("APIServer",)
        if who == "E":
            return (self.fam["engine"],)
        return self.fam["early"] if phase == "early" else self.fam["late"](rank)

    def check_pids(self, who: str, rank: int, pids: list[int]) -> None:
        assert len(set(pids)) <= 1, self.where()
        if not pids:
            return
        pid = pids[0]
        if who == "A":
            assert pid == self.api_pid, self.where()
        elif who == "E":
            self.engine_pid = self.engine_pid or pid
            assert pid == self.engine_pid and pid != self.api_pid, self.where()
        else:
            known = self.worker_pids.setdefault(rank, pid)
            assert known == pid, self.where()
            assert pid not in (self.api_pid, self.engine_pid), self.where()

    def record(self, who: str, rank: int, phase: str, msg: tuple[str, int, str]) -> None:
        basename, lineno, fmt = msg
        shape = shape_of(self.next())
        assert shape.names == self.prefixes(who, rank, phase), self.where()
        self.check_pids(who, rank, [p for _n, p in shape.prefixes])
        assert (shape.level, shape.file, shape.line) == ("INFO", basename, lineno), self.where()
        assert template_regex(fmt).match(shape.message), f"{self.where()} !~ {fmt!r}"

    def step(self, step: dict[str, Any]) -> None:
        kind = step["kind"]
        if kind == "log":
            ranks = range(8) if step["who"] == "W" else [0]
            for rank in ranks:
                self.record(step["who"], rank, step["phase"], step["msg"])
        elif kind == "logo":
            self.check_logo()
        elif kind == "bar":
            self.check_bar(step["total"])
        elif kind == "graphs":
            self.check_graphs(*step["kind_mode"])
        elif kind == "routes":
            paths = []
            while self.i < len(self.lines) and "] Route: " in self.lines[self.i]:
                self.record("A", 0, "late", step["msg"])
                paths.append(shape_of(self.lines[self.i - 1]).message.split(",")[0])
            for needed in (
                "Route: /health",
                "Route: /v1/models",
                "Route: /v1/completions",
                "Route: /metrics",
            ):
                assert needed in paths, paths
        elif kind == "raw":
            shape = shape_of(self.next())
            assert shape.names == ("APIServer",) and shape.level is None, self.where()
            assert template_regex(step["fmt"]).match(shape.message), self.where()
            self.check_pids("A", 0, [p for _n, p in shape.prefixes])

    def check_logo(self) -> None:
        lineno, template = logo(self.root)
        expected_lines = (template % (self.version, self.model)).split("\n")
        assert len(expected_lines) == 6
        for k, art in enumerate(expected_lines):
            shape = shape_of(self.next())
            assert shape.names == ("APIServer",), self.where()
            assert (shape.level, shape.file, shape.line) == ("INFO", "utils.py", lineno), (
                self.where()
            )
            # NewLineFormatter: "\n" -> "\r\n" + header, so all but the last end in "\r"
            cr = "\r" if k < len(expected_lines) - 1 else ""
            assert shape.message == art + cr, self.where()

    def check_bar(self, total: int) -> None:
        fmt = module_string(self.root, "model_executor/model_loader/weight_utils.py", "_BAR_FORMAT")
        regex = bar_regex(fmt, "Loading safetensors checkpoint shards")
        seen = []
        for _k in range(total + 2):
            physical = self.next()
            shape = shape_of(physical)
            assert shape.names == self.fam["late"](0) and shape.level is None, self.where()
            assert shape.message.startswith("\r"), self.where()
            match = regex.match(shape.message[1:])
            assert match, f"{self.where()} !~ _BAR_FORMAT"
            assert int(match.group("total")) == total
            seen.append(int(match.group("n")))
        assert seen == [*range(total + 1), total]
        tail = shape_of(self.next())
        assert tail.names == self.fam["late"](0) and tail.message == "", self.where()

    def check_graphs(self, kind: str, mode: str) -> None:
        runner = (self.root / "vllm/v1/worker/gpu_model_runner.py").read_text(encoding="utf-8")
        assert '"Capturing CUDA graphs ({}, {})"' in runner
        desc = f"Capturing CUDA graphs ({kind}, {mode})"
        shape = shape_of(self.next())
        assert shape.names == self.fam["late"](0) and shape.level is None, self.where()
        assert shape.message.startswith("\r"), self.where()
        updates = shape.message[1:].split("\r")
        ns = []
        for update in updates:
            match = graph_regex(desc).match(update)
            assert match, f"{self.where()}: {update!r}"
            ns.append(int(match.group("n")))
        total = int(graph_regex(desc).match(updates[0]).group("total"))  # type: ignore[union-attr]
        assert ns[0] == 0 and ns[-1] == ns[-2] == total and ns == sorted(ns)
        assert graph_regex(desc).match(updates[-1]).group("bar") == "█" * 10  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("golden-trees")
    return {v: (patched_tree(v, root) if v < "0.18" else vllm_tree(v)) for v in VERSIONS}


@pytest.mark.parametrize("version", VERSIONS)
def test_successful_start_matches_the_wheel_line_by_line(
    version: str, trees: dict[str, Path], tmp_path: Path
) -> None:
    home = make_home(tmp_path / "home", load_seconds=1.0)
    run = run_sim(home, trees[version], serve_args(home, version))
    assert run.ready and run.returncode == 0, run.text[-3000:]
    lines = run.physical_lines()
    api_pid = shape_of(lines[0]).prefixes[0][1]
    model = str(home / "models" / "Kimi-K2.5")
    # the installed tree: the wheel's files, patched by fleet's engine before 0.18 (the
    # patch moves the lines of eagle.py, the simulator must print the moved numbers)
    checker = Checker(version, trees[version], lines, api_pid, model)
    for step in expected(version, trees[version]):
        checker.step(step)
    assert sorted(checker.worker_pids) == list(range(8))
    assert len(set(checker.worker_pids.values())) == 8
    # after the SIGTERM: vLLM's and uvicorn's shutdown lines, nothing else
    rest = [shape_of(line) for line in lines[checker.i :]]
    assert [s.message for s in rest if s.level is None] == [
        "INFO:     Shutting down",
        "INFO:     Waiting for application shutdown.",
        "INFO:     Application shutdown complete.",
    ]


def test_the_checker_fails_on_a_wrong_line_number(trees: dict[str, Path], tmp_path: Path) -> None:
    """Negative control: the same transcript against another version's line numbers."""
    home = make_home(tmp_path / "home", load_seconds=0.5)
    run = run_sim(home, trees["0.17.0"], serve_args(home, "0.17.0"))
    lines = run.physical_lines()
    api_pid = shape_of(lines[0]).prefixes[0][1]
    checker = Checker(
        "0.18.0", vllm_tree("0.18.0"), lines, api_pid, str(home / "models" / "Kimi-K2.5")
    )
    with pytest.raises(AssertionError):
        for step in expected("0.18.0", vllm_tree("0.18.0")):
            checker.step(step)


def test_logger_on_stdout_tqdm_and_uvicorn_on_stderr(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    home = make_home(tmp_path / "home", load_seconds=0.5)
    run = run_sim(home, trees["0.17.0"], serve_args(home, "0.17.0"), split_streams=True)
    assert run.ready, run.text[-2000:]
    out, err = run.stdout.decode(), run.stderr.decode()
    assert "Loading safetensors checkpoint shards" not in out and "Capturing CUDA graphs" not in out
    assert "Loading safetensors checkpoint shards" in err and "Capturing CUDA graphs" in err
    assert "Application startup complete." in err and "Application startup complete." not in out
    assert "[gpu_model_runner.py:" in out and "[gpu_model_runner.py:" not in err
    # the prefix is on every physical line of both streams (vLLM wraps both writes)
    for text in (out, err):
        for line in text.split("\n")[:-1]:
            assert re.match(r"^\((APIServer|EngineCore_DP0|Worker|Worker_TP\d) pid=\d+\) ", line), (
                line
            )

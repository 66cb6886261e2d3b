"""The load phase tracker: where a ``vllm serve`` start-up is, from its raw log.

Pure and local (no network, no clock unless given): feed it the physical lines of a
vLLM log as they arrive, with their process prefixes (``(Worker pid=W) (Worker_TP0
pid=W) ``), carriage returns (tqdm writes each update as ``\\r`` + text; CUDA-graph
capture is one physical line of ``\\r``-separated updates) and ANSI colour (vLLM <= 0.15
colours the prefix even in files). It answers the phase, the weight shards n/N, the
percent of the current progress bar, an ETA (tqdm's own ``remaining``, or the shard rate)
and an event whenever the phase changes.

Phases, in order (a phase never goes back: late lines of other workers are ignored)::

    starting -> config -> engine -> weights -> drafter -> compile -> kv-cache
             -> cuda-graphs -> api-server -> ready

The patterns are data (:data:`PATTERNS`): each names the vLLM format string it matches,
the file that logs it and the versions that have it (docs/research/vllm-serve.md §1.3, §1.4);
the regex is derived from the format string, and tests check every format string against
the real wheels of each family. :func:`patterns_for` selects a version family's set.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from fleet.onhost.families import FAMILY_NAMES, log_family

PHASES = (
    "starting",
    "config",
    "engine",
    "weights",
    "drafter",
    "compile",
    "kv-cache",
    "cuda-graphs",
    "api-server",
    "ready",
)
FAMILIES = FAMILY_NAMES  # fleet/onhost/families.py: the one table of version families
ALL = FAMILIES


@dataclass(frozen=True)
class Pattern:
    """One vLLM log message that marks a phase.

    ``fmt`` is vLLM's format string (``%s``/``%d``/``%.2f`` fields) or, for uvicorn, its
    literal text; ``prefix`` marks a format whose end varies by version (matched as a
    prefix). ``source`` is the file under ``vllm/`` that logs it (``uvicorn`` for the
    server's own lines)."""

    phase: str
    fmt: str
    source: str
    families: tuple[str, ...] = ALL
    prefix: bool = False
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", fmt_regex(self.fmt, self.prefix))


_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.(?:\d+|\*))?([diouxXeEfFgGcrsa%])")


def fmt_regex(fmt: str, prefix: bool = False) -> re.Pattern[str]:
    """A regex matching messages logged with printf-style ``fmt`` (from its start)."""
    out = ["^"]
    last = 0
    for match in _FIELD.finditer(fmt):
        out.append(re.escape(fmt[last : match.start()]))
        kind = match.group(1)
        if kind == "%":
            out.append("%")
        elif kind in "di":
            out.append(r"(-?\d+)")
        elif kind in "eEfFgG":
            out.append(r"([-+\d.eE]+|nan|inf)")
        else:
            out.append(r"(.*?)")
        last = match.end()
    out.append(re.escape(fmt[last:]))
    if not prefix:
        out.append(r"\s*$")
    return re.compile("".join(out))


# The weight-loading bar: vLLM's _BAR_FORMAT (model_loader/weight_utils.py, 0.10.2-0.33.0)
# "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining},
# {rate_fmt}]\n" with desc "Loading safetensors checkpoint shards" (+ " (eager)").
WEIGHTS_BAR_FORMAT = (
    "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, "
    "{rate_fmt}]\n"
)
WEIGHTS_BAR_DESCS = (
    "Loading safetensors checkpoint shards",
    "Loading safetensors checkpoint shards (eager)",
    "Loading pt checkpoint shards",
    "Multi-thread loading shards",
)
# CUDA-graph capture: tqdm's default bar with desc "Capturing CUDA graphs ({}, {})"
# (v1/worker/gpu_model_runner.py, 0.10.2-0.33.0).
GRAPHS_BAR_DESC = "Capturing CUDA graphs ({}, {})"

_TIME = r"(?:\d+:)?\d{2}:\d{2}"
_WEIGHTS_BAR = re.compile(
    r"^(?P<desc>"
    + "|".join(re.escape(d) for d in sorted(WEIGHTS_BAR_DESCS, key=len, reverse=True))
    + r"):\s+(?P<pct>\d+)% Completed \| (?P<n>\d+)/(?P<total>\d+) "
    rf"\[(?P<elapsed>{_TIME})<(?P<remaining>{_TIME}|\?), *(?P<rate>[\d.]+|\?)(?P<unit>s/it|it/s)\]"
)
_GRAPHS_BAR = re.compile(
    r"^Capturing CUDA graphs \((?P<kind>[^,()]+), (?P<mode>[^()]+)\):\s+(?P<pct>\d+)%\|[^|]*\| "
    rf"(?P<n>\d+)/(?P<total>\d+) \[(?P<elapsed>{_TIME})<(?P<remaining>{_TIME}|\?)"
)

PATTERNS: tuple[Pattern, ...] = (
    # -- APIServer, config time
    Pattern(
        "config", "vLLM API server version %s", "entrypoints/openai/api_server.py", ("<=0.14",)
    ),
    Pattern(
        "config",
        "vLLM server version %s, serving model %s",
        "entrypoints/utils.py",
        ("0.15-0.17", ">=0.18"),
    ),
    Pattern("config", "non-default args: %s", "entrypoints/utils.py"),
    Pattern("config", "Resolved architecture: %s", "config/model.py"),
    Pattern("config", "Using max model len %s", "config/model.py"),
    Pattern(
        "config",
        "Chunked prefill is enabled with max_num_batched_tokens=%d.",
        "config/scheduler.py",
    ),
    Pattern("config", "Asynchronous scheduling is %s.", "config/vllm.py", ("0.15-0.17", ">=0.18")),
    # -- EngineCore and workers, before the weights
    Pattern("engine", "Initializing a V1 LLM engine (v%s) with config: %s", "v1/engine/core.py"),
    Pattern(
        "engine",
        "DP group leader: node_rank=%d",
        "v1/executor/multiproc_executor.py",
        ("0.15-0.17", ">=0.18"),
        prefix=True,
    ),
    Pattern(
        "engine",
        "world_size=%d rank=%d local_rank=%d distributed_init_method=%s backend=%s",
        "distributed/parallel_state.py",
    ),
    Pattern("engine", "vLLM is using nccl==%s", "distributed/device_communicators/pynccl.py"),
    Pattern(
        "engine",
        "rank %s in world size %s is assigned as DP rank %s",
        "distributed/parallel_state.py",
        prefix=True,
    ),
    # -- the target's weights
    Pattern("weights", "Starting to load model %s...", "v1/worker/gpu_model_runner.py"),
    Pattern(
        "weights",
        "Using %s attention backend out of potential backends: %s",
        "platforms/cuda.py",
        ("<=0.14", "0.15-0.17", ">=0.18"),
        prefix=True,
    ),
    Pattern(
        "weights",
        "Loading weights took %.2f seconds",
        "model_executor/model_loader/default_loader.py",
    ),
    # -- the drafter
    Pattern("drafter", "Loading drafter model...", "v1/worker/gpu_model_runner.py"),
    Pattern(
        "drafter",
        "Detected EAGLE model ",
        "v1/spec_decode/eagle.py",
        ("<=0.14", "0.15-0.17", ">=0.18"),
        prefix=True,
    ),
    Pattern(
        "drafter",
        "Using auxiliary layers from speculative config: %s",
        "v1/worker/gpu_model_runner.py",
    ),
    # -- profile run and torch.compile
    Pattern("compile", "Model loading took ", "v1/worker/gpu_model_runner.py", prefix=True),
    Pattern(
        "compile",
        "Encoder cache will be initialized with a budget of %s tokens",
        "v1/worker/gpu_model_runner.py",
        prefix=True,
    ),
    Pattern(
        "compile", "Using cache directory: %s for vLLM's torch.compile", "compilation/backends.py"
    ),
    Pattern("compile", "Dynamo bytecode transform time: %.2f s", "compilation/backends.py"),
    Pattern(
        "compile",
        "Compiling a graph for compile range %s takes %.2f s",
        "compilation/backends.py",
        ("0.15-0.17", ">=0.18"),
    ),
    Pattern(
        "compile",
        "Compiling a graph for dynamic shape takes %.2f s",
        "compilation/backends.py",
        ("<=0.14",),
    ),
    Pattern(
        "compile",
        "Directly load the compiled graph(s) for compile range %s from the cache, took %.3f s",
        "compilation/backends.py",
        ("0.15-0.17", ">=0.18"),
    ),
    Pattern(
        "compile",
        "torch.compile takes %.2f s in total",
        "compilation/monitor.py",
        ("<=0.14", "0.15-0.17"),
    ),
    # 0.18 passes the format as a parameter default (monitor_torch_compile(message=...))
    Pattern("compile", "torch.compile took %.2f s in total", "compilation/monitor.py", (">=0.18",)),
    Pattern(
        "compile", "Initial profiling/warmup run took %.2f s", "compilation/monitor.py", (">=0.18",)
    ),
    # -- KV cache
    Pattern(
        "kv-cache", "Profiling CUDA graph memory: %s", "v1/worker/gpu_model_runner.py", (">=0.18",)
    ),
    Pattern(
        "kv-cache",
        "Estimated CUDA graph memory: %.2f GiB total",
        "v1/worker/gpu_model_runner.py",
        (">=0.18",),
    ),
    Pattern("kv-cache", "Available KV cache memory: ", "v1/worker/gpu_worker.py", prefix=True),
    Pattern("kv-cache", "GPU KV cache size: %s tokens", "v1/core/kv_cache_utils.py"),
    Pattern(
        "kv-cache",
        "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
        "v1/core/kv_cache_utils.py",
        (">=0.18",),
    ),
    Pattern(
        "kv-cache",
        "Maximum concurrency for %s tokens per request: %.2fx",
        "v1/core/kv_cache_utils.py",
    ),
    # -- CUDA graphs (the bars are matched separately)
    Pattern(
        "cuda-graphs",
        "Graph capturing finished in %.0f secs, took %.2f GiB",
        "v1/worker/gpu_model_runner.py",
    ),
    Pattern(
        "cuda-graphs",
        "init engine (profile, create kv cache, warmup model) took %.2f s",
        "v1/engine/core.py",
        prefix=True,
    ),
    # -- the HTTP server
    Pattern("api-server", "Supported tasks: %s", "entrypoints/openai/api_server.py"),
    Pattern(
        "api-server",
        "Starting vLLM API server %d on %s",
        "entrypoints/openai/api_server.py",
        ("<=0.14", "0.15-0.17"),
    ),
    Pattern(
        "api-server", "Starting vLLM server on %s", "entrypoints/openai/api_server.py", (">=0.18",)
    ),
    Pattern("api-server", "Available routes are:", "entrypoints/launcher.py"),
    Pattern("api-server", "Route: %s, Methods: %s", "entrypoints/launcher.py"),
    Pattern("api-server", "Started server process [%d]", "uvicorn"),
    Pattern("api-server", "Waiting for application startup.", "uvicorn"),
    Pattern("ready", "Application startup complete.", "uvicorn"),
)


def version_family(version: str | None) -> str | None:
    """``<=0.14``, ``0.15-0.17`` or ``>=0.18`` for a vLLM version (None if unknown)."""
    if not version:
        return None
    match = re.match(r"^(\d+)\.(\d+)", version.strip())
    if not match:
        return None
    return log_family(version.strip())


def patterns_for(version: str | None) -> tuple[Pattern, ...]:
    """The patterns of ``version``'s family (every family's when it is unknown)."""
    family = version_family(version)
    if family is None:
        return PATTERNS
    return tuple(p for p in PATTERNS if family in p.families)


# ---- reading a physical line -------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PROC_PREFIX = re.compile(r"^\((?:[^()]*?) pid=\d+(?:, ip=[0-9a-fA-F.:]+)?\) ?")
_OLD_PREFIX = re.compile(r"^\((?:VllmWorker|VllmWorkerProcess) [^()]*\) ?")
_HEADER = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)? "
    r"\[[^\]]+:\d+\] "
)
_UVICORN = re.compile(r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):\s+")
_SEQ = re.compile(r" \[seq=\d+\]$")
_PREFIX_ONLY = re.compile(r"^(?:\x1b\[[0-9;]*m|\([^()]*? pid=\d+[^()]*\)|\s)*$")


def strip_prefixes(text: str) -> str:
    """A segment without ANSI colour and vLLM's process prefixes (nested ones too)."""
    text = _ANSI.sub("", text)
    while True:
        stripped = _PROC_PREFIX.sub("", text, count=1)
        stripped = _OLD_PREFIX.sub("", stripped, count=1)
        if stripped == text:
            return text
        text = stripped


def message_of(segment: str) -> str:
    """The message of one ``\\r``-free segment: prefixes, the log header (or uvicorn's
    ``INFO:     ``) and a trailing line ending removed."""
    text = strip_prefixes(segment.rstrip("\n"))
    text = _SEQ.sub("", text)
    header = _HEADER.match(text)
    if header:
        return text[header.end() :]
    uvicorn = _UVICORN.match(text)
    if uvicorn and not text.startswith("INFO "):
        return text[uvicorn.end() :]
    return text


def segments(raw: str) -> list[str]:
    """The updates of a physical line: split on ``\\r`` (tqdm) and ``\\n``; a ``\\r\\n``
    line end (vLLM's multi-line records) is one line end, not an update."""
    text = raw.replace("\r\n", "\n")
    out: list[str] = []
    for line in text.split("\n"):
        prefix = ""
        parts = line.split("\r")
        for i, part in enumerate(parts):
            if i == 0 and len(parts) > 1:
                # text before the first \r is the process prefix tqdm's \r overwrites
                prefix = part
                if strip_prefixes(part).strip() == "":
                    continue
            if i > 0 and not part:
                continue  # a trailing \r (a multi-line record's line end)
            out.append(prefix + part if i > 0 and _PREFIX_ONLY.match(prefix) else part)
    return [s for s in out if s.strip()]


def parse_interval(text: str) -> float | None:
    """tqdm's ``MM:SS`` / ``H:MM:SS`` in seconds (None for ``?``)."""
    if not text or text == "?":
        return None
    total = 0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        total = total * 60 + int(part)
    return float(total)


# ---- the tracker ---------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseEvent:
    """The phase changed to ``phase`` (from ``previous``) on ``line`` (1-based)."""

    phase: str
    previous: str
    line: int
    message: str


@dataclass(frozen=True)
class LoadProgress:
    """Where the start-up is: the phase, the target's weight shards, the current bar."""

    phase: str
    shards_done: int | None = None
    shards_total: int | None = None
    percent: float | None = None
    eta_s: float | None = None
    detail: str | None = None
    lines: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "shards": None
            if self.shards_total is None
            else {"done": self.shards_done, "total": self.shards_total},
            "percent": self.percent,
            "eta_s": self.eta_s,
            "detail": self.detail,
        }


class PhaseTracker:
    """Feed raw physical lines; read :attr:`progress`; collect phase-change events."""

    def __init__(
        self,
        version: str | None = None,
        *,
        clock: Callable[[], float] | None = None,
        patterns: Sequence[Pattern] | None = None,
    ) -> None:
        self.patterns = tuple(patterns) if patterns is not None else patterns_for(version)
        self.clock = clock
        self.phase = "starting"
        self.lines = 0
        self.events: list[PhaseEvent] = []
        self.shards_done: int | None = None
        self.shards_total: int | None = None
        self.percent: float | None = None
        self.eta_s: float | None = None
        self.detail: str | None = None
        self._shard_times: list[tuple[float, int]] = []

    @property
    def progress(self) -> LoadProgress:
        return LoadProgress(
            self.phase,
            self.shards_done,
            self.shards_total,
            self.percent,
            self.eta_s,
            self.detail,
            self.lines,
        )

    def feed_text(self, text: str) -> list[PhaseEvent]:
        """Feed a chunk of log text (several physical lines)."""
        events: list[PhaseEvent] = []
        for line in text.split("\n"):
            if line:
                events += self.feed(line)
        return events

    def feed_lines(self, lines: Iterable[str]) -> list[PhaseEvent]:
        events: list[PhaseEvent] = []
        for line in lines:
            events += self.feed(line)
        return events

    def feed(self, raw: str) -> list[PhaseEvent]:
        """One physical line (or a partial one: tqdm's updates before its ``\\n``)."""
        self.lines += 1
        events: list[PhaseEvent] = []
        for segment in segments(raw):
            message = message_of(segment)
            event = self._segment(message)
            if event is not None:
                events.append(event)
        self.events += events
        return events

    def _advance(self, phase: str, message: str) -> PhaseEvent | None:
        if PHASES.index(phase) <= PHASES.index(self.phase):
            return None
        previous = self.phase
        self.phase = phase
        if phase not in ("weights", "drafter"):
            self.percent = None
            self.eta_s = None
        self.detail = None
        return PhaseEvent(phase, previous, self.lines, message)

    def _segment(self, message: str) -> PhaseEvent | None:
        bar = _WEIGHTS_BAR.match(message)
        if bar:
            return self._weights_bar(bar, message)
        graphs = _GRAPHS_BAR.match(message)
        if graphs:
            event = self._advance("cuda-graphs", message)
            if self.phase == "cuda-graphs":
                self.percent = float(graphs.group("pct"))
                self.eta_s = parse_interval(graphs.group("remaining"))
                self.detail = "{}, {} {}/{}".format(
                    graphs.group("kind"),
                    graphs.group("mode"),
                    graphs.group("n"),
                    graphs.group("total"),
                )
            return event
        for pattern in self.patterns:
            if pattern.regex.match(message):
                return self._advance(pattern.phase, message)
        return None

    def _weights_bar(self, bar: re.Match[str], message: str) -> PhaseEvent | None:
        event = self._advance("weights", message)
        n, total = int(bar.group("n")), int(bar.group("total"))
        if self.phase == "weights":
            self.shards_done, self.shards_total = n, total
            self.percent = float(bar.group("pct"))
            remaining = parse_interval(bar.group("remaining"))
            if remaining is None and n:
                elapsed = parse_interval(bar.group("elapsed")) or 0.0
                remaining = elapsed / n * (total - n)
            if remaining is None and self.clock is not None:
                remaining = self._rate_eta(n, total)
            self.eta_s = 0.0 if n >= total else remaining
            self.detail = f"{n}/{total} shards"
        elif self.phase == "drafter":
            self.detail = f"drafter {n}/{total} shards"
        return event

    def _rate_eta(self, n: int, total: int) -> float | None:
        assert self.clock is not None
        now = self.clock()
        self._shard_times.append((now, n))
        first = self._shard_times[0]
        if n <= first[1] or now <= first[0]:
            return None
        rate = (n - first[1]) / (now - first[0])
        return (total - n) / rate if rate > 0 else None


def track(lines: Iterable[str], version: str | None = None) -> PhaseTracker:
    """A tracker fed with ``lines`` (convenience for whole logs)."""
    tracker = PhaseTracker(version)
    tracker.feed_lines(lines)
    return tracker

# fleet on-host module: the rehearsal vLLM's knowledge of vLLM, read from the INSTALLED tree.
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# Each message the simulator prints is named here by where vLLM keeps it (candidate files,
# a fragment of its format string, sometimes the function): the format string, the
# logger level and the call-start line number come from the host's own files at run
# time, so each version (patched or not) prints its own `[file.py:line]`, and a message a
# version does not have (or logs at DEBUG) is not printed. Tracebacks are assembled from
# the installed source lines in the same way (`SIM_FRAMES`).
#
# What cannot be read that way is kept in `sim_family()` (docs/research/vllm-serve.md §1.4):
# process prefix shapes and colour, the EngineCore process name, the banner form.
import os
from typing import Any, Dict, List, Optional, Tuple

from fleet.onhost.families import WORKER_EARLY_PREFIX, log_family, version_tuple
from fleet.onhost.rehearsal.source_mining import (
    class_decorators,
    find_line,
    find_log_call,
    find_raise,
    find_string,
    literal_text,
    render_string,
    source_file,
)
from fleet.onhost.rehearsal.vllm_sim_out import CYAN, CYAN_BOLD, Frame

RUNNER = "v1/worker/gpu_model_runner.py"
API_SERVER = ("entrypoints/openai/api_server.py", "entrypoints/launchers/api_server/entry.py")
LAUNCHER = ("entrypoints/launcher.py", "entrypoints/launchers/launcher.py")
CONFIG_FILES = ("config/model.py", "config/__init__.py", "config.py")
MOE_FILES = (
    "model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe.py",
    "model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
    "compressed_tensors_moe.py",
)
PROPOSERS = ("v1/spec_decode/eagle.py", "v1/spec_decode/llm_base_proposer.py")
EXECUTOR = "v1/executor/multiproc_executor.py"
CORE = "v1/engine/core.py"

# key: (candidate files, format fragments (first found wins), enclosing function or None,
#       who prints it: "A" APIServer, "E" EngineCore, "W0" TP rank 0, "W" every worker)
SIM_MESSAGES: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...], Optional[str], str]] = {
    "platform": (("platforms/__init__.py",), ("Automatically detected platform %s.",), None, "A"),
    "banner_old": (API_SERVER, ("vLLM API server version %s",), None, "A"),
    "args": (
        (
            "entrypoints/utils.py",
            "entrypoints/serve/utils/api_utils.py",
            "entrypoints/common/startup.py",
        ),
        ("non-default args: %s",),
        None,
        "A",
    ),
    "arch": (CONFIG_FILES, ("Resolved architecture: %s",), None, "A"),
    "max_len": (CONFIG_FILES, ("Using max model len %s",), None, "A"),
    "chunked": (
        ("config/scheduler.py", "config/__init__.py"),
        ("Chunked prefill is enabled with max_num_batched_tokens=%d.",),
        None,
        "A",
    ),
    "async_sched": (("config/vllm.py",), ("Asynchronous scheduling is %s.",), None, "A"),
    # MultiModalRegistry.supports_multimodal_inputs, info_once in each process that asks:
    # the APIServer's input processor, the EngineCore's scheduler, each worker's runner
    "text_only": (
        ("multimodal/registry.py",),
        ("are set to 0, running in text-only mode",),
        None,
        "A",
    ),
    "engine_init": ((CORE,), ("Initializing a V1 LLM engine (v%s) with config: %s",), None, "E"),
    "headless": (
        ("entrypoints/cli/serve.py",),
        ("Launching vLLM (v%s) headless multiproc executor",),
        None,
        "A",
    ),
    "ray_pg_new": (
        ("v1/executor/ray_utils.py", "executor/ray_utils.py"),
        ("No current placement group found. Creating a new placement group.",),
        None,
        "E",
    ),
    "ray_pg_wait": (
        ("v1/executor/ray_utils.py", "executor/ray_utils.py"),
        ("Waiting for creating a placement group of specs for %d seconds.",),
        None,
        "E",
    ),
    "dp_leader": ((EXECUTOR,), ("DP group leader: ",), None, "E"),
    "world": (
        ("distributed/parallel_state.py",),
        ("world_size=%d rank=%d local_rank=%d distributed_init_method=%s backend=%s",),
        None,
        "W",
    ),
    "nccl": (
        ("distributed/device_communicators/pynccl.py",),
        ("vLLM is using nccl==%s",),
        None,
        "W0",
    ),
    "rank": (("distributed/parallel_state.py",), (" is assigned as DP rank ",), None, "W"),
    "load_start": ((RUNNER,), ("Starting to load model %s...",), None, "W0"),
    "attn": (("platforms/cuda.py",), ("attention backend out of potential backends",), None, "W0"),
    "moe": (
        MOE_FILES,
        ("Using CompressedTensorsWNA16MarlinMoEMethod", "Using CompressedTensorsWNA16MoEMethod"),
        None,
        "W",
    ),
    "weights_took": (
        ("model_executor/model_loader/default_loader.py",),
        ("Loading weights took %.2f seconds",),
        None,
        "W0",
    ),
    "drafter": ((RUNNER,), ("Loading drafter model...",), None, "W"),
    "eagle_embed": (
        PROPOSERS,
        ("Detected EAGLE model with distinct embed_tokens weights",),
        None,
        "W",
    ),
    "eagle_lm_head": (
        PROPOSERS,
        ("Detected EAGLE model with distinct lm_head weights",),
        None,
        "W",
    ),
    "aux_layers": ((RUNNER,), ("Using auxiliary layers from speculative config: %s",), None, "W"),
    "model_loading": ((RUNNER,), ("Model loading took ",), None, "W0"),
    "encoder_cache": ((RUNNER,), ("Encoder cache will be initialized with a budget",), None, "W"),
    "compile_cache": (
        ("compilation/backends.py",),
        ("Using cache directory: %s for vLLM's torch.compile",),
        None,
        "W0",
    ),
    "dynamo": (
        ("compilation/backends.py",),
        ("Dynamo bytecode transform time: %.2f s",),
        None,
        "W0",
    ),
    "compile_range": (
        ("compilation/backends.py",),
        ("Compiling a graph for compile range %s takes %.2f s", "Compiling a graph for shape %s"),
        None,
        "W0",
    ),
    "compile_total": (
        ("compilation/monitor.py",),
        ("torch.compile takes %.2f s in total", "torch.compile took %.2f s in total"),
        None,
        "W0",
    ),
    "warmup": (("compilation/monitor.py",), ("Initial profiling/warmup run took",), None, "W0"),
    "cg_profiling": ((RUNNER,), ("Profiling CUDA graph memory: %s",), None, "W0"),
    "cg_estimate": ((RUNNER,), ("Estimated CUDA graph memory: %.2f GiB total",), None, "W0"),
    "kv_memory": (("v1/worker/gpu_worker.py",), ("Available KV cache memory: ",), None, "W0"),
    "kv_size": (
        ("v1/core/kv_cache_utils.py",),
        ("GPU KV cache size: %s tokens", " KV cache size: %s tokens, Maximum concurrency"),
        None,
        "E",
    ),
    "kv_concurrency": (
        ("v1/core/kv_cache_utils.py",),
        ("Maximum concurrency for %s tokens per request: %.2fx",),
        None,
        "E",
    ),
    "graphs_done": (
        (RUNNER,),
        ("Graph capturing finished in %.0f secs, took %.2f GiB",),
        None,
        "W0",
    ),
    "init_engine": (
        (CORE,),
        ("init engine (profile, create kv cache, warmup model) took",),
        None,
        "E",
    ),
    "tasks": (API_SERVER, ("Supported tasks: %s",), None, "A"),
    "server_start": (
        API_SERVER,
        ("Starting vLLM API server %d on %s", "Starting vLLM server on %s"),
        None,
        "A",
    ),
    "routes": (LAUNCHER, ("Available routes are:",), None, "A"),
    "route": (LAUNCHER, ("Route: %s, Methods: %s",), None, "A"),
    "http_shutdown": (LAUNCHER, ("Shutting down FastAPI HTTP server.",), None, "A"),
    # SIGTERM with --shutdown-timeout N > 0 (0.18+, EngineCore._handle_shutdown)
    "shutdown_initiated": ((CORE,), ("Shutdown initiated (timeout=%d)",), None, "E"),
    "shutdown_draining": ((CORE,), ("Draining %d in-flight requests (timeout=%ds)",), None, "E"),
    "shutdown_complete": ((CORE,), ("Shutdown complete",), None, "E"),
    "worker_failed": ((EXECUTOR,), ("WorkerProc failed to start.",), None, "W"),
    "core_failed": ((CORE,), ("EngineCore failed to start.",), None, "E"),
    "worker_died": ((EXECUTOR,), ("Worker proc %s died unexpectedly",), None, "E"),
    "core_died": (
        ("v1/engine/core_client.py", "v1/utils.py"),
        ("Engine core proc %s died unexpectedly", "engine core exited unexpectedly"),
        None,
        "A",
    ),
}

# vLLM's own routes as `fleet serve` sees them listed (launcher.py logs app.routes; the
# methods of a route come from a set, printed in no stable order).
SIM_ROUTES = (
    ("/openapi.json", "HEAD, GET"),
    ("/docs", "HEAD, GET"),
    ("/redoc", "HEAD, GET"),
    ("/health", "GET"),
    ("/load", "GET"),
    ("/ping", "POST"),
    ("/ping", "GET"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    ("/v1/models", "GET"),
    ("/version", "GET"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/metrics", "GET"),
)


# What the start-up prints differently in each log family (fleet/onhost/families.py,
# `log_family()`): the banner (the logo of log_version_and_model from 0.15, "vLLM API
# server version %s" before), the engine's process name (the single engine is "EngineCore"
# from 0.18) and how a worker takes its rank's prefix at init_device (0.18 replaces the
# early "(Worker pid=W)" prefix, before the rank's name wraps the current write).
SIM_FAMILY_SHAPES: Dict[str, Dict[str, Any]] = {
    "<=0.14": {"logo": False, "engine_name": "EngineCore_DP0", "worker_prefix": "wrap"},
    "0.15-0.17": {"logo": True, "engine_name": "EngineCore_DP0", "worker_prefix": "wrap"},
    ">=0.18": {"logo": True, "engine_name": "EngineCore", "worker_prefix": "replace"},
}


def sim_version_tuple(version: str) -> Tuple[int, ...]:
    return version_tuple(version)


def sim_family(version: str, package_dir: str, env: Dict[str, str], tty: bool) -> Dict[str, Any]:
    """What differs by version family and cannot be read from a format string
    (docs/research/vllm-serve.md §1.1 and §1.4)."""
    v = sim_version_tuple(version)
    name = log_family(version)
    shape = SIM_FAMILY_SHAPES[name]
    early = v >= WORKER_EARLY_PREFIX
    # prefix colour: always in 0.10.x (bold cyan); unless NO_COLOR in 0.13-0.15; only on a
    # tty (or VLLM_LOGGING_COLOR=1) from 0.16 (vllm/utils/system_utils.py _add_prefix)
    if v < (0, 11):
        colour: Optional[str] = CYAN_BOLD
    elif v < (0, 16):
        colour = None if env.get("NO_COLOR") else CYAN
    else:
        wanted = env.get("VLLM_LOGGING_COLOR") == "1" or (
            tty and not env.get("NO_COLOR") and env.get("VLLM_LOGGING_COLOR") != "0"
        )
        colour = CYAN if wanted else None
    logger_src = source_file(package_dir, "logger.py")
    fmt = ""
    if logger_src is not None:
        fmt = "".join(literal_text(n) or "" for n in _assigned(logger_src, "_FORMAT"))
    return {
        "name": name,
        "version": v,
        # ≥0.18 names the single engine "EngineCore" (v1/engine/utils.py, core.py)
        "engine_name": shape["engine_name"],
        # 0.17+ prefix workers "(Worker pid=W)" before init_device; 0.17 nests the
        # second prefix, 0.18 re-wraps the original write (system_utils.py)
        "worker_early_prefix": early,
        "worker_prefix": shape["worker_prefix"],
        "worker_nested_prefix": early and shape["worker_prefix"] == "wrap",
        "colour": colour,
        # 0.33 moved the prefix into the log format: tqdm and tracebacks unprefixed
        "prefix_in_format": "vllm_process_name" in fmt,
        # ≤0.14: "vLLM API server version %s"; ≥0.15 the logo (log_version_and_model)
        "logo": shape["logo"],
        # `info` of "world_size=..." only from 0.13 (debug before)
        "health_dead_status": 500 if v < (0, 13) else 503,
    }


def _assigned(src: Any, name: str) -> List[Any]:
    import ast

    out = []
    for node in src.tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = node.value
            if isinstance(value, ast.JoinedStr):
                out.extend(value.values)
            else:
                out.append(value)
    return out


class SimSource:
    """Messages, exception texts and traceback frames of one installed vLLM tree."""

    def __init__(self, package_dir: str, version: str) -> None:
        self.pkg = package_dir
        self.version = version
        self._msgs: Dict[str, Optional[Dict[str, Any]]] = {}

    # -- log messages ---------------------------------------------------------------
    def msg(self, key: str) -> Optional[Dict[str, Any]]:
        if key not in self._msgs:
            files, needles, func, _who = SIM_MESSAGES[key]
            found = None
            for needle in needles:
                found = find_log_call(self.pkg, list(files), [needle], func=func)
                if found is not None and found["level"] == "DEBUG":
                    # the same text is often logged at DEBUG and at INFO (parallel_state)
                    again = find_log_call(self.pkg, list(files), [needle], skip_debug=True)
                    found = again or found
                if found is not None:
                    break
            self._msgs[key] = found
        return self._msgs[key]

    def printed(self, key: str) -> bool:
        """Whether this version logs `key` at INFO or above (the default level)."""
        found = self.msg(key)
        return found is not None and found["level"] != "DEBUG"

    def who(self, key: str) -> str:
        return SIM_MESSAGES[key][3]

    def logo(self) -> Optional[Dict[str, Any]]:
        """The logo template of `log_version_and_model` and the line of its `lgr.info`."""
        import ast

        for rel in (
            "entrypoints/utils.py",
            "entrypoints/serve/utils/api_utils.py",
            "entrypoints/common/startup.py",
        ):
            src = source_file(self.pkg, rel)
            fn = src.function("log_version_and_model") if src is not None else None
            if fn is None or src is None:
                continue
            template = None
            line = None
            plain = None
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name == "Template" and node.args:
                        template = literal_text(node.args[0])
                    if name == "info" and line is None:
                        line = node.lineno
                value = node.value if isinstance(node, ast.Assign) else None
                if isinstance(value, ast.Constant) and "%s" in str(value.value):
                    plain = str(value.value)
            if line is not None:
                return {
                    "basename": rel.rsplit("/", 1)[-1],
                    "line": line,
                    "template": template,
                    "plain": plain,
                }
        return None

    # -- exceptions -----------------------------------------------------------------
    def raise_site(
        self, files: Tuple[str, ...], needle: str, func: Optional[str] = None
    ) -> Optional[Dict[str, Any]]:
        for rel in files:
            found = find_raise(self.pkg, rel, needle, func)
            if found is not None:
                return found
        return None

    def message(
        self, files: Tuple[str, ...], needle: str, values: Dict[str, Any], fallback: str
    ) -> str:
        """A message as the installed source builds it (an f-string filled with
        `values`), or `fallback` when the source has no such text."""
        for rel in files:
            found = find_string(self.pkg, rel, needle)
            if found is not None:
                return render_string(found, values)
        return fallback

    # -- traceback frames ---------------------------------------------------------------
    def path(self, rel: str) -> str:
        return os.path.join(self.pkg, *rel.split("/"))

    def frame(
        self, files: Tuple[str, ...], func: str, needle: str, callee: Optional[str] = None
    ) -> Optional[Frame]:
        for rel in files:
            found = find_line(self.pkg, rel, func, needle)
            if found is not None:
                return Frame(self.path(rel), found["line"], found["func"], found["raw"], callee)
        return None

    def decorated(self, rel: str, qualname: str) -> bool:
        return any(
            d.rsplit(".", 1)[-1] == "instrument" for d in class_decorators(self.pkg, rel, qualname)
        )

    def otel(self) -> Optional[Frame]:
        return self.frame(("tracing/otel.py", "tracing.py"), "sync_wrapper", "return func(", "func")

    def chain(self, specs: List[Any]) -> List[Frame]:
        """Frames for a list of specs, each `(files, func, needle, callee)`, a Frame, or
        `("otel-if", rel, qualname)` (vLLM's `@instrument` wrapper frame, when that
        function is decorated in this version); specs not found are left out."""
        out: List[Frame] = []
        for spec in specs:
            if isinstance(spec, Frame):
                out.append(spec)
            elif spec[0] == "otel-if":
                if self.decorated(spec[1], spec[2]):
                    found = self.otel()
                    if found is not None:
                        out.append(found)
            else:
                found = self.frame(*spec)
                if found is not None:
                    out.append(found)
        return out


# ---- frames outside vLLM: the host's own Python and the wheels vLLM runs on ----------


def stdlib_frame(rel: str, func: str, needle: str, callee: Optional[str] = None) -> Optional[Frame]:
    """A frame of the host Python's standard library (e.g. asyncio/runners.py), read from
    the interpreter that runs the simulator."""
    stdlib = os.path.dirname(os.__file__)
    found = find_line(stdlib, rel, func, needle)
    if found is None:
        return None
    return Frame(os.path.join(stdlib, rel), found["line"], found["func"], found["raw"], callee)


def site_path(rel: str) -> str:
    """Where a dependency of vLLM (uvloop, pydantic, torch) lives in this environment."""
    import sysconfig

    return os.path.join(sysconfig.get_paths()["purelib"], rel)


def sim_api_top(src: SimSource, bin_path: str) -> List[Frame]:
    """From the console script to `run_server` (the APIServer's outer frames)."""
    frames = [Frame(bin_path, 8, "<module>", "    sys.exit(main())", "main")]
    frames += src.chain(
        [
            (("entrypoints/cli/main.py",), "main", "args.dispatch_function(args)", None),
            (("entrypoints/cli/serve.py",), "cmd", "uvloop.run(run_server(args))", None),
        ]
    )
    frames.append(
        Frame(site_path("uvloop/__init__.py"), 109, "run", "    return __asyncio.run(", None)
    )
    for rel, func, needle in (
        ("asyncio/runners.py", "run", "return runner.run(main)"),
        ("asyncio/runners.py", "Runner.run", "return self._loop.run_until_complete(task)"),
    ):
        found = stdlib_frame(rel, func, needle)
        if found is not None:
            frames.append(found)
    frames.append(Frame("uvloop/loop.pyx", 1518, "uvloop.loop.Loop.run_until_complete", ""))
    frames.append(Frame(site_path("uvloop/__init__.py"), 61, "wrapper", "    return await main"))
    frames += src.chain([(API_SERVER, "run_server", "await run_server_worker(", None)])
    return frames


def sim_aenter() -> Optional[Frame]:
    return stdlib_frame("contextlib.py", "__aenter__", "return await")


def sim_engine_client(src: SimSource) -> List[Frame]:
    """`run_server_worker` down to `build_async_engine_client_from_engine_args`."""
    frames: List[Frame] = []
    for spec in (
        (API_SERVER, "run_server_worker", "async with build_async_engine_client(", None),
        "aenter",
        (
            API_SERVER,
            "build_async_engine_client",
            "async with build_async_engine_client_from_engine_args(",
            None,
        ),
        "aenter",
    ):
        if spec == "aenter":
            found = sim_aenter()
            if found is not None:
                frames.append(found)
        else:
            frames += src.chain([spec])
    return frames


PYDANTIC_INIT = (
    "pydantic/_internal/_dataclasses.py",
    121,
    "__init__",
    "    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
)


def sim_pydantic_frame() -> Frame:
    rel, line, func, text = PYDANTIC_INIT
    return Frame(site_path(rel), line, func, text)


def sim_config_frames(src: SimSource, what: str) -> List[Frame]:
    """`create_engine_config` down to the pydantic validator of ModelConfig, ParallelConfig
    or SpeculativeConfig (`what`)."""
    args = ("engine/arg_utils.py",)
    specs: List[Any] = [
        (
            API_SERVER,
            "build_async_engine_client_from_engine_args",
            "vllm_config = engine_args.create_engine_config(",
            "create_engine_config",
        ),
    ]
    if what == "model":
        specs += [
            (args, "create_engine_config", "model_config = self.create_model_config()", None),
            (args, "create_model_config", "return ModelConfig(", None),
        ]
    elif what == "parallel":
        specs += [(args, "create_engine_config", "parallel_config = ParallelConfig(", None)]
    else:
        specs += [
            (
                args,
                "create_engine_config",
                "speculative_config = self.create_speculative_config(",
                None,
            ),
            (args, "create_speculative_config", "return SpeculativeConfig(", None),
        ]
    return [*src.chain(specs), sim_pydantic_frame()]


def sim_launch_frames(src: SimSource) -> List[Frame]:
    """`build_async_engine_client_from_engine_args` down to `wait_for_engine_startup`."""
    frames = src.chain(
        [
            (
                API_SERVER,
                "build_async_engine_client_from_engine_args",
                "AsyncLLM.from_vllm_config(",
                "from_vllm_config",
            ),
            (("v1/engine/async_llm.py",), "from_vllm_config", "return cls(", None),
            ("otel-if", "v1/engine/async_llm.py", "AsyncLLM.__init__"),
            (
                ("v1/engine/async_llm.py",),
                "AsyncLLM.__init__",
                "EngineCoreClient.make_async_mp_client(",
                "make_async_mp_client",
            ),
            (
                ("v1/engine/core_client.py",),
                "make_async_mp_client",
                "return AsyncMPClient(",
                "AsyncMPClient",
            ),
            ("otel-if", "v1/engine/core_client.py", "AsyncMPClient.__init__"),
            (("v1/engine/core_client.py",), "AsyncMPClient.__init__", "super().__init__(", None),
            (("v1/engine/core_client.py",), "MPClient.__init__", "with launch_core_engines(", None),
        ]
    )
    found = stdlib_frame("contextlib.py", "__exit__", "next(self.gen)")
    if found is not None:
        frames.append(found)
    frames += src.chain(
        [(("v1/engine/utils.py",), "launch_core_engines", "wait_for_engine_startup(", None)]
    )
    return frames


def sim_worker_frames(src: SimSource, step: str) -> List[Frame]:
    """`worker_main` down to the worker's `init_device` or `load_model` (`step`)."""
    specs: List[Any] = [
        ((EXECUTOR,), "worker_main", "worker = WorkerProc(", "WorkerProc"),
        ("otel-if", EXECUTOR, "WorkerProc.__init__"),
    ]
    if step == "init_device":
        specs += [
            ((EXECUTOR,), "WorkerProc.__init__", "self.worker.init_device()", None),
            (
                ("v1/worker/gpu_worker.py",),
                "init_device",
                "init_worker_distributed_environment(",
                None,
            ),
            (
                ("v1/worker/gpu_worker.py",),
                "init_worker_distributed_environment",
                "ensure_model_parallel_initialized(",
                None,
            ),
            (
                ("distributed/parallel_state.py",),
                "ensure_model_parallel_initialized",
                "initialize_model_parallel(",
                None,
            ),
            (
                ("distributed/parallel_state.py",),
                "initialize_model_parallel",
                "_TP = init_model_parallel_group(",
                None,
            ),
        ]
    else:
        specs += [
            ((EXECUTOR,), "WorkerProc.__init__", "self.worker.load_model()", None),
            (("v1/worker/gpu_worker.py",), "load_model", "self.model_runner.load_model(", None),
        ]
    return src.chain(specs)


# The engine core process's frames from its entry point into `EngineCore.__init__`, the
# start of every start-up traceback raised in the engine core (chain() specs).
ENGINE_CORE_INIT: List[Any] = [
    ((CORE,), "run_engine_core", "engine_core = EngineCoreProc(", "EngineCoreProc"),
    ("otel-if", CORE, "EngineCoreProc.__init__"),
    ((CORE,), "EngineCoreProc.__init__", "super().__init__(", None),
    ("otel-if", CORE, "EngineCore.__init__"),
]


def sim_core_frames(src: SimSource) -> List[Frame]:
    """`run_engine_core` down to `wait_for_ready`'s `raise e from None`."""
    return src.chain(
        [
            *ENGINE_CORE_INIT,
            (
                (CORE,),
                "EngineCore.__init__",
                "self.model_executor = executor_class(",
                "executor_class",
            ),
            ("otel-if", "v1/executor/abstract.py", "Executor.__init__"),
            (("v1/executor/abstract.py",), "__init__", "self._init_executor()", None),
            ((EXECUTOR,), "_init_executor", "WorkerProc.wait_for_ready(", "wait_for_ready"),
            ((EXECUTOR,), "wait_for_ready", "raise e from None", None),
        ]
    )


def sim_kv_init_frames(src: SimSource, then: List[Any]) -> List[Frame]:
    """`run_engine_core` down to `_initialize_kv_caches` (with vLLM's `@instrument`
    wrapper where this version has it), then the specs `then`: where the profile run and
    the KV cache sizing fail."""
    return src.chain(
        [
            *ENGINE_CORE_INIT,
            (
                (CORE,),
                "EngineCore.__init__",
                "self._initialize_kv_caches(",
                "_initialize_kv_caches",
            ),
            ("otel-if", CORE, "EngineCore._initialize_kv_caches"),
            *then,
        ]
    )


def sim_bootstrap_frames() -> List[Frame]:
    """multiprocessing's `_bootstrap` -> `run` (the second EngineCore traceback)."""
    out: List[Frame] = []
    for func, needle in (("_bootstrap", "self.run()"), ("run", "self._target(")):
        found = stdlib_frame("multiprocessing/process.py", func, needle)
        if found is not None:
            out.append(found)
    return out


# model types the Transformers releases vLLM 0.10-0.33 pin know without remote code
# (transformers' CONFIG_MAPPING; only those a fleet profile meets)
SIM_TRANSFORMERS_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "gemma3",
    "phi3",
)

# fleet on-host program: the rehearsal vLLM, a simulated `vllm serve` for sandbox hosts.
#
# Installed by the sandbox as an executable `<env>/bin/vllm` (a shebang naming the env's
# python, the bundle of this module, `sys.exit(main(sys.argv[1:]))`; see
# fleet.onhost.client.executable). Python 3.8+, standard library only, never vLLM.
#
# From the outside it behaves like vLLM on an 8-GPU host (docs/research/vllm-serve.md): the
# same command line, log lines with the installed tree's format strings and call-start
# line numbers, the APIServer / EngineCore / worker processes and their prefixes, tqdm's
# bytes, the failure points, tracebacks and exit codes, a socket bound during the load and
# listening after `Application startup complete.`, and the HTTP endpoints. What fails is
# decided from the installed source (the EAGLE-3 allowlist, SupportsEagle3 on the outer
# model class, the proposer's image_token_index path, the registry), the model and
# drafter `config.json`, and the host's GPU state. The 40-minute load is compressed to
# the host's `load_seconds` (~/.fleet-sandbox/host.json, overridden by sim.json).
#
# Knobs for tests: ~/.fleet-sandbox/sim.json (see SIM_KNOBS), read at start.
import json
import os
import re
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from fleet.onhost._common import Refused, locate_vllm
from fleet.onhost.rehearsal.source_mining import (
    config_registry,
    find_log_call,
    find_string,
    metric_definitions,
    multimodal_image_token,
    registry_architectures,
    string_constant,
    supports_multimodal,
)
from fleet.onhost.rehearsal.vllm_sim_args import (
    SIM_USAGE,
    SimArgError,
    sim_field_order,
    sim_parse,
    sim_spec_fields,
)
from fleet.onhost.rehearsal.vllm_sim_http import SimApp, SimMetrics, sim_bind, sim_serve
from fleet.onhost.rehearsal.vllm_sim_nodes import SimNodes
from fleet.onhost.rehearsal.vllm_sim_out import (
    Frame,
    Prefixed,
    SimWriter,
    Tqdm,
    format_record,
    percent_format,
    prefix_text,
    traceback_text,
    write_fd,
)
from fleet.onhost.rehearsal.vllm_sim_proc import (
    SimChild,
    SimGpuState,
    sim_die_by,
    sim_spawn_engine,
    sim_spawn_workers,
)
from fleet.onhost.rehearsal.vllm_sim_src import (
    API_SERVER,
    CORE,
    EXECUTOR,
    PROPOSERS,
    RUNNER,
    SIM_ROUTES,
    SIM_TRANSFORMERS_MODEL_TYPES,
    SimSource,
    sim_api_top,
    sim_bootstrap_frames,
    sim_config_frames,
    sim_core_frames,
    sim_engine_client,
    sim_family,
    sim_kv_init_frames,
    sim_launch_frames,
    sim_worker_frames,
    site_path,
)
from fleet.onhost.vllm_tree import (
    admits,
    allowlists,
    find_class,
    judge_allowlist,
    model_classes,
)

SIM_STATE_DIR = "~/.fleet-sandbox"
SIM_DEFAULT_LOAD_SECONDS = 20.0
# ~/.fleet-sandbox/sim.json (every key optional)
SIM_KNOBS = {
    "acceptance_rate": 0.6,  # per-token acceptance the /metrics counters move at
    "load_seconds": None,  # override of host.json's load_seconds
    "slow_factor": 1.0,  # a slow load: every phase takes this many times longer
    # one of: "oom" (CUDA OOM in a worker while loading weights), "port-in-use", "stall"
    # (output stops, the process stays), "nccl" (NCCL error in init_device),
    # "crash-after-ready" (the engine dies after ready: /health 503, then exit 0),
    # "truncated-line" (one line written in two parts, or cut by a SIGKILL)
    "fault": None,
    "fault_at_shard": None,  # weights shard where oom/stall/truncated-line strike (N/3)
    "fault_phase": "weights",  # stall: "weights" | "compile" | "graphs"
    "oom_rank": 0,
    "crash": "engine",  # crash-after-ready: "engine" (EngineCore killed) | "worker" (TP3)
    "crash_after_s": 1.0,
    "watchdog_s": 5.0,  # vLLM's VLLM_WATCHDOG_TIME_S (launcher.watchdog_loop)
    "truncate_pause_s": 1.0,
    "truncate_then": "resume",  # "resume" | "kill" (SIGKILL of the process group)
    "number_lines": False,  # " [seq=N]" before each line ending (all processes, from 1)
    "http_delay_s": 0.0,  # every HTTP answer this late (a cut lands inside readiness)
    # generation time (vllm_sim_http.sim_schedule): a decode step, the prefill per prompt
    # token, and the drafter's share of a step per speculative token; 0: answers at once
    "step_ms": 0.0,
    "prefill_ms_per_token": 0.0,
    "draft_cost": 0.05,
    "rendezvous_timeout_s": None,  # torch's 600 s store timeout, else compressed as the load
}
SIM_PHASES = (
    ("config", 0.02),
    ("engine", 0.02),
    ("init_device", 0.03),
    ("weights", 0.70),
    ("drafter", 0.03),
    ("compile", 0.08),
    ("kv", 0.04),
    ("graphs", 0.06),
    ("api", 0.02),
)
SIM_NCCL_VERSION = "2.27.5"
# weight_utils.py _BAR_FORMAT (0.10.2-0.33.0), used if the installed file lacks it
SIM_BAR_FORMAT = (
    "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, "
    "{rate_fmt}]\n"
)
SIM_ATTN_MLA = ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"]
SIM_ATTN = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]
SIM_GRAPH_SIZES = (("mixed prefill-decode", "PIECEWISE", 51), ("decode", "FULL", 35))
GIB = 1024**3
MIB = 1024**2
_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.(?:\d+|\*))?[diouxXeEfFgGcrsa%]")


class SimExit(Exception):
    """End the simulated server: exit `code`, or die by `signal`."""

    def __init__(self, code: int = 0, sig: Optional[int] = None) -> None:
        Exception.__init__(self, code)
        self.code = code
        self.sig = sig


class SimTerminated(Exception):
    """SIGTERM during the load: vLLM's handler raises KeyboardInterrupt("terminated")."""


def sim_fill(fmt: str, args: Any, labels: Optional[Dict[str, Any]] = None) -> str:
    """`fmt % args`; when the number of fields differs between versions, the fields are
    filled by the words before each one (`labels`: {"tp rank": 3, ...}, longest match).
    A format without fields (a version that stopped passing an argument) prints as is."""
    fields = [m for m in _PLACEHOLDER.finditer(fmt) if m.group(0) != "%%"]
    if not fields:
        return fmt.replace("%%", "%") if args else fmt
    if labels is not None and (args is None or len(args) != len(fields)):
        values = []
        start = 0
        for match in fields:
            text = re.sub(r"[^a-z0-9 ]+", " ", fmt[start : match.start()].lower())
            text = " ".join(text.split())
            best = None
            for key in labels:
                if (text.endswith(key) or (key == "" and best is None)) and (
                    best is None or len(key) > len(best)
                ):
                    best = key
            value = labels.get(best, "N/A") if best is not None else "N/A"
            spec = match.group(0)
            if spec[-1] in "dif" and not isinstance(value, (int, float)):
                spec = "%s"
            values.append(percent_format(spec, (value,)))
            start = match.end()
        out = []
        last = 0
        for index, match in enumerate(fields):
            value = values[index]
            out.append(fmt[last : match.start()].replace("%%", "%"))
            out.append(value)
            last = match.end()
        out.append(fmt[last:].replace("%%", "%"))
        return "".join(out)
    return percent_format(fmt, tuple(args) if args is not None else ())


def gib(value_bytes: float) -> float:
    return round(value_bytes / GIB, 2)


def _read_json(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _safetensors_header(path: str) -> Dict[str, Any]:
    """The JSON header of a .safetensors file (8-byte little-endian length + JSON)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return {}
            size = int.from_bytes(raw, "little")
            if size <= 0 or size > 100 * MIB:
                return {}
            doc = json.loads(fh.read(size).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


class SimModel:
    """A model or drafter directory as vLLM reads it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.exists = os.path.isdir(path)
        self.config = _read_json(os.path.join(path, "config.json"))
        text = self.config.get("text_config")
        self.text = text if isinstance(text, dict) else self.config
        archs = self.config.get("architectures") or []
        self.arch = str(archs[0]) if archs else ""
        self.archs = [str(a) for a in archs]
        self.model_type = str(self.config.get("model_type") or "")
        self.text_model_type = str(self.text.get("model_type") or self.model_type)
        self.shards = sorted(
            f for f in (os.listdir(path) if self.exists else []) if f.endswith(".safetensors")
        )
        index = _read_json(os.path.join(path, "model.safetensors.index.json"))
        self.total_size = 0
        try:
            self.total_size = int((index.get("metadata") or {}).get("total_size") or 0)
        except (TypeError, ValueError):
            self.total_size = 0
        self.tensors: Dict[str, Any] = {}
        if len(self.shards) <= 4:
            for shard in self.shards:
                header = _safetensors_header(os.path.join(path, shard))
                self.tensors.update({k: v for k, v in header.items() if k != "__metadata__"})
        if not self.total_size and self.tensors:
            self.total_size = sum(
                int((v.get("data_offsets") or [0, 0])[1])
                - int((v.get("data_offsets") or [0, 0])[0])
                for v in self.tensors.values()
                if isinstance(v, dict)
            )

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.text:
            return self.text[key]
        return self.config.get(key, default)

    @property
    def layers(self) -> int:
        return int(self.get("num_hidden_layers", 0) or 0)

    @property
    def max_len(self) -> int:
        return int(self.get("max_position_embeddings", 0) or 0) or 2048

    def has_tensor(self, suffix: str) -> bool:
        return any(name.endswith(suffix) for name in self.tensors)

    def aux_layer_ids(self, version: Tuple[int, ...]) -> Optional[List[int]]:
        """The drafter's aux layer ids as this vLLM reads them: top level only before
        0.25, `eagle_config.eagle_aux_hidden_state_layer_ids` too from 0.25
        (gpu_model_runner._get_eagle3_aux_layers_from_config)."""
        ids = self.config.get("eagle_aux_hidden_state_layer_ids")
        if ids is None and version >= (0, 25):
            nested = self.config.get("eagle_config")
            if isinstance(nested, dict):
                ids = nested.get("eagle_aux_hidden_state_layer_ids")
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            return [int(i) for i in ids]
        return None


class SimProcess:
    """One simulated process: its pid, its prefixed stdout/stderr, who writes its bytes."""

    def __init__(self, sim: "Sim", pid: int, child: Optional[SimChild]) -> None:
        self.sim = sim
        self.pid = pid
        self.child = child
        self.name = ""
        self.out = Prefixed(lambda s: self._emit(1, s))
        self.err = Prefixed(lambda s: self._emit(2, s))
        self.format_prefix = ""

    @property
    def alive(self) -> bool:
        return self.child is None or self.child.alive

    def _emit(self, fd: int, text: str) -> None:
        text = self.sim.writer.numbered((self.pid, fd), text)
        data = text.encode("utf-8")
        if self.child is None:
            write_fd(fd, data)
        else:
            self.child.write(fd, data)

    def decorate(self, name: str, mode: str = "wrap") -> None:
        """vLLM's decorate_logs(name): `wrap` the current write, or `replace` (0.18's
        re-prefixing of the original write)."""
        self.name = name
        text = prefix_text(name, self.pid, self.sim.family["colour"])
        if self.sim.family["prefix_in_format"]:
            self.format_prefix = "(%s pid=%d) " % (name, self.pid)
            return
        for stream in (self.out, self.err):
            if mode == "replace":
                stream.replace_wrappers(text)
            else:
                stream.wrap(text)

    def log(self, level: str, basename: str, line: int, message: str) -> None:
        record = format_record(level, basename, line, message)
        if self.format_prefix:
            header_end = record.find("] ") + 2
            header = record[:header_end]
            record = record.replace(header, self.format_prefix + header)
        with self.sim.writer.lock:
            self.out.write(record)

    def stderr(self, text: str) -> None:
        with self.sim.writer.lock:
            self.err.write(text)

    def stdout(self, text: str) -> None:
        with self.sim.writer.lock:
            self.out.write(text)


class Sim:
    """One run of `vllm serve`: parse, decide, load (compressed), serve, end."""

    def __init__(self, argv: List[str], located: Dict[str, Any]) -> None:
        self.argv = argv
        self.pkg = located["package_dir"]
        self.version = located["version"]
        self.src = SimSource(self.pkg, self.version)
        self.env = dict(os.environ)
        self.family = sim_family(self.version, self.pkg, self.env, sys.stdout.isatty())
        self.v = self.family["version"]
        self.state_dir = os.path.expanduser(SIM_STATE_DIR)
        self.host = _read_json(os.path.join(self.state_dir, "host.json"))
        knobs = dict(SIM_KNOBS)
        knobs.update(_read_json(os.path.join(self.state_dir, "sim.json")))
        self.knobs = knobs
        load = knobs.get("load_seconds")
        if load is None:
            load = self.host.get("load_seconds", SIM_DEFAULT_LOAD_SECONDS)
        try:
            self.load_seconds = max(0.0, float(load)) * max(
                0.0, float(knobs.get("slow_factor") or 1.0)
            )
        except (TypeError, ValueError):
            self.load_seconds = SIM_DEFAULT_LOAD_SECONDS
        self.writer = SimWriter(number_lines=bool(knobs.get("number_lines")))
        self.gpu_count = int(self.host.get("gpu_count") or 8)
        self.gpu_total_mib = int(self.host.get("memory_total_mib") or 183359)
        self.gpus = SimGpuState(
            os.path.join(self.state_dir, "gpu-state.json"), self.gpu_count, self.gpu_total_mib
        )
        self.api = SimProcess(self, os.getpid(), None)
        self.engine: Optional[SimProcess] = None
        self.workers: List[SimProcess] = []
        self.sock: Optional[socket.socket] = None
        self.ready = False
        self.terminated = False
        self.phase = "start"
        self.t0 = time.monotonic()
        self.bin_path = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "vllm"

    # -- output helpers ---------------------------------------------------------------
    def procs_for(self, who: str) -> List[SimProcess]:
        if who == "A":
            return [self.api]
        if who == "E":
            return [self.engine] if self.engine is not None else []
        if who == "W0":
            return self.workers[:1]
        return list(self.workers)

    def say(
        self,
        key: str,
        args: Any = (),
        labels: Optional[Dict[str, Any]] = None,
        procs: Optional[List[SimProcess]] = None,
        per_proc: Optional[Any] = None,
    ) -> bool:
        """Log message `key` as this version does (nothing if it lacks it or logs it at
        DEBUG). `per_proc(i, proc)` gives (args, labels) for each printing process."""
        found = self.src.msg(key)
        if found is None or found["level"] == "DEBUG":
            return False
        targets = procs if procs is not None else self.procs_for(self.src.who(key))
        for i, proc in enumerate(targets):
            a, lab = (args, labels) if per_proc is None else per_proc(i, proc)
            text = sim_fill(found["fmt"], a, lab)
            proc.log(found["level"], found["basename"], found["line"], text)
        return True

    def sleep(self, phase: str, fraction: float = 1.0) -> None:
        share = dict(SIM_PHASES).get(phase, 0.0)
        self.pause(self.load_seconds * share * fraction)

    def pause(self, seconds: float) -> None:
        end = time.monotonic() + max(0.0, seconds)
        while True:
            nodes = getattr(self, "nodes", None)
            if nodes is not None and nodes.lost:
                self.node_lost()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def pause_plain(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    # -- start --------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            try:
                self.start()
            except SimTerminated:
                self.report_terminated()
                raise SimExit(130, signal.SIGINT) from None
            except KeyboardInterrupt:
                self.report_terminated(ctrl_c=True)
                raise SimExit(130, signal.SIGINT) from None
            return self.serve_forever()
        except SimExit as done:
            self.cleanup()
            if done.sig is not None:
                sim_die_by(done.sig)
            return done.code
        except BaseException:
            self.cleanup()
            raise

    def _on_sigterm(self, *_: Any) -> None:
        if self.ready:
            self.terminated = True
            return
        raise SimTerminated()

    def start(self) -> None:
        self.register_pid()
        self.say_platform(self.api)
        try:
            values, given = sim_parse(self.pkg, self.argv)
        except SimArgError as exc:
            sys.stderr.write(SIM_USAGE + "\nvllm serve: error: %s\n" % exc)
            sys.stderr.flush()
            raise SimExit(2) from None
        self.args = values
        self.given = given
        self.model_path = str(values.get("model_tag") or values.get("model") or "")
        if not self.model_path:
            sys.stderr.write(
                SIM_USAGE + "\nvllm serve: error: the model_tag argument is required\n"
            )
            raise SimExit(2)
        self.tp = int(values.get("tensor_parallel_size") or 1)
        self.pp = int(values.get("pipeline_parallel_size") or 1)
        self.nodes = SimNodes(self, values)
        self.served = list(values.get("served_model_name") or [self.model_path])
        self.port = int(values.get("port") or 8000)
        self.host_addr = str(values.get("host") or "")
        self.util = float(values.get("gpu_memory_utilization") or 0.9)
        self.trust = bool(values.get("trust_remote_code"))
        given_keys = values.get("api_key")
        if isinstance(given_keys, str):
            given_keys = [given_keys]
        env_key = self.env.get("VLLM_API_KEY")
        self.api_keys = list(given_keys or ([env_key] if env_key else []))
        self.spec = values.get("speculative_config")
        if self.nodes.headless:
            self.run_headless()
        self.api.decorate("APIServer")
        self.say_banner()
        self.say(
            "args",
            (self.non_default_args(),),
        )
        self.bind()
        self.phase = "config"
        self.configure()
        self.sleep("config")
        self.start_engine()
        self.load()
        self.serve_http()

    def run_headless(self) -> None:
        """A worker node of vLLM's own multi-node mode: no API server, its ranks only."""
        self.say("headless", (self.version, self.nodes.master_addr))
        self.phase = "config"
        self.configure()
        self.start_engine()
        self.load()
        while not self.terminated:
            if self.nodes.lost:
                self.node_lost()
            time.sleep(0.05)
        raise SimExit(0)

    def say_ray(self, key: str, args: Any) -> None:
        self.say(key, args, procs=[self.engine] if self.engine is not None else [self.api])

    def fail_rendezvous(self, exc: str) -> None:
        """The process group could not form: torch's error in every local rank's traceback
        (init_distributed_environment), the engine fails, the server exits 1."""
        frames = self.src.chain(
            [
                (("distributed/parallel_state.py",), "init_distributed_environment",
                 "torch.distributed.init_process_group(", None),
            ]
        )  # fmt: skip
        if self.nodes.headless or not self.workers:
            target = self.workers[0] if self.workers else self.api
            target.stderr(traceback_text(frames, exc) + "\n")
            raise SimExit(1)
        self.fail_workers("init_device", frames, exc, self.workers[:1])

    def node_lost(self) -> None:
        """A node of the group died: the collectives of the others time out (NCCL's
        watchdog, compressed) and the server exits 1."""
        lost = self.nodes.lost
        self.pause_plain(min(3.0, max(0.5, self.load_seconds * 0.05)))
        procs = self.workers[:1] or [self.api]
        procs[0].stderr(
            "[Rank %d] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, "
            "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600051 "
            "milliseconds before timing out. (%s stopped answering)\n" % (self.nodes.rank0, lost)
        )
        raise SimExit(1)

    def say_platform(self, proc: SimProcess) -> None:
        # 0.10.x logs "Automatically detected platform cuda." at INFO on import, before
        # decorate_logs, once in every process (DEBUG from 0.11: not printed)
        self.say("platform", ("cuda",), procs=[proc])

    def say_banner(self) -> None:
        if self.family["logo"]:
            logo = self.src.logo()
            if logo is not None:
                disabled = self.env.get("VLLM_DISABLE_LOG_LOGO", "0") not in ("", "0")
                if logo["template"] and not disabled:
                    text = re.sub(r"\$\{?[a-z]\}?", "", logo["template"])
                else:
                    text = logo["plain"] or "vLLM server version %s, serving model %s"
                self.api.log(
                    "INFO",
                    logo["basename"],
                    logo["line"],
                    percent_format(text, (self.version, self.model_path)),
                )
                return
        self.say("banner_old", (self.version,))

    def non_default_args(self) -> Dict[str, Any]:
        order = sim_field_order(self.pkg)
        out: Dict[str, Any] = {}
        keys = list(self.given)
        if "model_tag" in keys and "model" not in keys:
            keys.insert(keys.index("model_tag") + 1, "model")
        rank = {k: i for i, k in enumerate(order)}
        keys.sort(key=lambda k: rank.get(k, len(rank)))
        for key in keys:
            if key == "model":
                out["model"] = self.model_path
            elif key in self.args:
                out[key] = self.args[key]
        return out

    def bind(self) -> None:
        if self.knobs.get("fault") == "port-in-use":
            self.fail_bind()
        try:
            self.sock = sim_bind(self.host_addr, self.port)
        except OSError:
            self.fail_bind()

    def fail_bind(self) -> None:
        frames = sim_api_top(self.src, self.bin_path)
        frames += self.src.chain(
            [
                (
                    API_SERVER,
                    "run_server",
                    "listen_address, sock = setup_server(args)",
                    "setup_server",
                ),
                (
                    API_SERVER,
                    "setup_server",
                    "sock = create_server_socket(",
                    "create_server_socket",
                ),
                (API_SERVER, "create_server_socket", "sock.bind(", None),
            ]
        )
        self.api.stderr(traceback_text(frames, "OSError: [Errno 98] Address already in use") + "\n")
        raise SimExit(1)

    # -- config time (APIServer) --------------------------------------------------------
    def config_error(self, what: str, cls: str, message: str, kwargs: str) -> None:
        """A ValueError in a pydantic config's validation, as the APIServer prints it."""
        frames = sim_api_top(self.src, self.bin_path) + sim_engine_client(self.src)
        frames += sim_config_frames(self.src, what)
        self.api.stderr(traceback_text(frames, self.pydantic_error(cls, message, kwargs)) + "\n")
        raise SimExit(1)

    def pydantic_minor(self) -> str:
        """The pydantic minor vLLM requires (its METADATA), for the errors.pydantic.dev URL."""
        root = os.path.dirname(self.pkg)
        try:
            names = [
                n for n in os.listdir(root) if n.startswith("vllm-") and n.endswith(".dist-info")
            ]
            with open(os.path.join(root, names[0], "METADATA"), encoding="utf-8") as fh:
                for line in fh:
                    match = re.match(r"Requires-Dist: pydantic\s*>=\s*(\d+)\.(\d+)", line)
                    if match:
                        return "%s.%s" % match.groups()
        except (OSError, IndexError):
            pass
        return "2.12"

    def pydantic_error(self, cls: str, message: str, input_repr: str) -> str:
        """pydantic-core's text of a ValueError raised while validating `cls`
        (input_value truncated to its first 25 and last 24 characters)."""
        if len(input_repr) > 50:
            input_repr = input_repr[:25] + "..." + input_repr[-24:]
        return (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for %s\n"
            "  Value error, %s [type=value_error, input_value=%s, input_type=ArgsKwargs]\n"
            "    For further information visit https://errors.pydantic.dev/%s/v/value_error"
            % (cls, message, input_repr, self.pydantic_minor())
        )

    def configure(self) -> None:
        """ModelConfig (target), ParallelConfig, SpeculativeConfig (drafter), as vLLM's
        create_engine_config builds them, failing where vLLM would."""
        target = SimModel(self.model_path)
        self.target = target
        model_kwargs = "ArgsKwargs((), {'model': %r, 'runner': 'auto', 'tokenizer': %r, ...})" % (
            self.model_path,
            self.model_path,
        )
        self.check_model(target, "model", "ModelConfig", model_kwargs)
        self.target_max_len = target.max_len
        user_len = self.args.get("max_model_len")
        if user_len is not None and int(user_len) > self.target_max_len:
            msg = self.src.message(
                ("config/model.py", "config/__init__.py"),
                "User-specified max_model_len (",
                {
                    "max_model_len": int(user_len),
                    "max_len_key": "max_position_embeddings",
                    "derived_max_model_len": self.target_max_len,
                    "model_max_length": None,
                },
                "User-specified max_model_len (%d) is greater than the derived max_model_len"
                % int(user_len),
            )
            self.config_error("model", "ModelConfig", msg, model_kwargs)
        self.max_model_len = int(user_len) if user_len is not None else self.target_max_len
        self.say("arch", (target.arch,))
        self.say("max_len", (self.max_model_len,))
        # ParallelConfig: world size against the GPUs of this node (its share of a server
        # across nodes; with Ray, the cluster's)
        world = self.tp * self.pp
        if not self.nodes.fits():
            msg = self.src.message(
                ("config/parallel.py",),
                "is larger than the number of ",
                {"world_size": world, "gpu_count": self.gpu_count},
                "World size (%d) is larger than the number of available GPUs (%d) in this node."
                % (world, self.gpu_count),
            )
            self.config_error(
                "parallel",
                "ParallelConfig",
                msg,
                "ArgsKwargs((), {'pipeline_parallel_size': %d, 'tensor_parallel_size': %d, ...})"
                % (self.pp, self.tp),
            )
        self.drafter: Optional[SimModel] = None
        self.k = 0
        self.method = None
        if self.spec is not None:
            self.configure_spec()
        self.say("chunked", (int(self.args.get("max_num_batched_tokens") or 8192),))
        self.say("async_sched", ("enabled" if self.spec is not None else "disabled",))

    def check_model(self, model: SimModel, what: str, cls: str, kwargs: str) -> None:
        if not model.exists or not model.config:
            msg = self.src.message(
                (
                    "transformers_utils/config.py",
                    "transformers_utils/repo_utils.py",
                    "config/model.py",
                ),
                "Invalid repository ID or local directory specified",
                {"model": model.path},
                "Invalid repository ID or local directory specified: %r." % model.path,
            )
            self.config_error(what, cls, msg, kwargs)
        registry = config_registry(self.pkg)
        known = model.model_type in registry or model.model_type in SIM_TRANSFORMERS_MODEL_TYPES
        auto_map = model.config.get("auto_map")
        remote = isinstance(auto_map, dict) and "AutoConfig" in auto_map
        if not known and remote and not self.trust:
            self.config_error(
                what,
                cls,
                "Loading %s requires you to execute the configuration file in that repo on your "
                "local machine. Make sure you have read the code there to avoid malicious use, "
                "then set the option `trust_remote_code=True` to remove this error." % model.path,
                kwargs,
            )
        if not known and not remote:
            self.config_error(
                what,
                cls,
                "The checkpoint you are trying to load has model type `%s` but Transformers does "
                "not recognize this architecture. This could be because of an issue with the "
                "checkpoint, or because your version of Transformers is out of date.\n\nYou can "
                "update Transformers with the command `pip install --upgrade transformers`."
                % model.model_type,
                kwargs,
            )
        archs = registry_architectures(self.pkg) or []
        if model.arch not in archs:
            shown = "dict_keys(%r)" % archs
            msg = self.src.message(
                ("model_executor/models/registry.py",),
                " are not supported for now. ",
                {"architectures": model.archs, "all_supported_archs": shown},
                "Model architectures %r are not supported for now. Supported architectures: %s"
                % (model.archs, shown),
            )
            self.config_error(what, cls, msg, kwargs)

    def configure_spec(self) -> None:
        spec = self.spec
        if not isinstance(spec, dict):
            self.config_error(
                "spec", "SpeculativeConfig", "speculative_config must be a dict", repr(spec)
            )
            return
        fields = sim_spec_fields(self.pkg) or []
        unknown = [k for k in spec if fields and k not in fields]
        if unknown:
            frames = sim_api_top(self.src, self.bin_path) + sim_engine_client(self.src)
            frames += sim_config_frames(self.src, "spec")
            errors = []
            for key in unknown:
                value = spec[key]
                shown = repr(value)
                if len(shown) > 50:
                    shown = shown[:25] + "..." + shown[-24:]
                errors.append(
                    "%s\n  Unexpected keyword argument [type=unexpected_keyword_argument, "
                    "input_value=%s, input_type=%s]\n    For further information visit "
                    "https://errors.pydantic.dev/%s/v/unexpected_keyword_argument"
                    % (key, shown, type(value).__name__, self.pydantic_minor())
                )
            head = "pydantic_core._pydantic_core.ValidationError: %d validation error%s" % (
                len(errors),
                "" if len(errors) == 1 else "s",
            )
            head += " for SpeculativeConfig"
            self.api.stderr(traceback_text(frames, head + "\n" + "\n".join(errors)) + "\n")
            raise SimExit(1)
        kwargs = (
            "ArgsKwargs((), {%s, 'target_model_config': ModelConfig(...), "
            "'target_parallel_config': ParallelConfig(...)})"
            % (", ".join("%r: %r" % (k, v) for k, v in spec.items()))
        )
        method = spec.get("method")
        drafter_path = spec.get("model")
        if method is None and drafter_path and "eagle3" in str(drafter_path).lower():
            method = "eagle3"
        self.method = method
        if drafter_path and not spec.get("num_speculative_tokens"):
            msg = self.src.message(
                ("config/speculative.py", "config/__init__.py"),
                "num_speculative_tokens",
                {},
                "num_speculative_tokens must be provided with speculative model unless the "
                "draft model config contains an n_predict parameter.",
            )
            self.config_error("spec", "SpeculativeConfig", msg, kwargs)
        self.k = int(spec.get("num_speculative_tokens") or 0)
        if not drafter_path:
            return
        drafter = SimModel(str(drafter_path))
        self.drafter = drafter
        self.check_model(drafter, "spec", "SpeculativeConfig", kwargs)
        self.say("arch", (drafter.arch,))
        self.drafter_max_len = min(drafter.max_len, self.max_model_len)
        self.say("max_len", (self.drafter_max_len,))
        if method in ("eagle3", "extract_hidden_states"):
            verdict = judge_allowlist(allowlists(self.pkg))
            entries = verdict.get("entries")
            mtype = self.target.text_model_type
            if verdict["present"] and not admits(entries, mtype):
                name = verdict.get("name") or "aux_hidden_states_supported"
                msg = self.src.message(
                    (str(verdict.get("file") or "config/speculative.py"),),
                    " is only supported for ",
                    {"method": method, name: entries, "model_type": mtype},
                    "Eagle3 is only supported for %r models. Got "
                    "self.target_model_config.hf_text_config.model_type=%r" % (entries, mtype),
                )
                self.config_error("spec", "SpeculativeConfig", msg, kwargs)

    # -- engine and workers ---------------------------------------------------------------
    def worker_name(self, rank: int) -> str:
        name = "Worker"
        if self.pp > 1:
            name += "_PP%d" % (rank // self.tp)
        if self.tp > 1:
            name += "_TP%d" % (rank % self.tp)
        return name

    def start_engine(self) -> None:
        self.phase = "engine"
        first = self.nodes.rank0
        titles = ["VLLM::" + self.worker_name(first + r) for r in range(self.nodes.local_world)]
        spawned = sim_spawn_engine(sys.executable, titles, self.gpus.path, self.api.pid)
        engine_child: SimChild = spawned["engine"]
        self.worker_pipes = spawned["worker_pipes"]
        self.worker_titles = titles
        self.engine = SimProcess(self, engine_child.pid, engine_child)
        self.say_platform(self.engine)
        self.engine.decorate(self.family["engine_name"])
        if not self.nodes.headless:
            self.say("engine_init", (self.version, self.engine_config()))
            addr = self.nodes.master_addr if self.nodes.multinode else "127.0.0.1"
            self.say(
                "dp_leader",
                (0, 0, addr, addr, self.tp * self.pp, self.nodes.local_world),
            )
        self.sleep("engine")
        children = sim_spawn_workers(engine_child, titles, self.worker_pipes)
        self.workers = [SimProcess(self, c.pid, c) for c in children]
        for proc in self.workers:
            self.say_platform(proc)
            if self.family["worker_early_prefix"]:
                proc.decorate("Worker")

    def engine_config(self) -> str:
        spec = ""
        if self.spec is not None and self.drafter is not None:
            spec = (
                "speculative_config=SpeculativeConfig(method=%r, model=%r, num_spec_tokens=%d), "
                % (
                    self.method,
                    self.drafter.path,
                    self.k,
                )
            )
        quant = (
            self.target.config.get("quantization_config")
            or self.target.text.get("quantization_config")
            or {}
        )
        qname = quant.get("quant_method") if isinstance(quant, dict) else None
        return (
            "model=%r, %stokenizer=%r, skip_tokenizer_init=False, tokenizer_mode=auto, "
            "revision=None, tokenizer_revision=None, trust_remote_code=%s, dtype=torch.bfloat16, "
            "max_seq_len=%d, download_dir=None, load_format=auto, tensor_parallel_size=%d, "
            "pipeline_parallel_size=%d, data_parallel_size=1, disable_custom_all_reduce=False, "
            "quantization=%s, enforce_eager=%s, kv_cache_dtype=auto, device_config=cuda, "
            "seed=0, served_model_name=%s, enable_prefix_caching=True, "
            "enable_chunked_prefill=True, pooler_config=None, compilation_config={'level': 3}"
            % (
                self.model_path,
                spec,
                self.model_path,
                self.trust,
                self.max_model_len,
                self.tp,
                self.pp,
                qname,
                bool(self.args.get("enforce_eager")),
                self.served[0],
            )
        )

    def register_pid(self) -> None:
        """~/.fleet-sandbox/run/vllm-<pid>.pid: `fleet sandbox down` stops what is left."""
        run = os.path.join(self.state_dir, "run")
        if os.path.isdir(run):
            path = os.path.join(run, "vllm-%d.pid" % self.api.pid)
            try:
                with open(path + ".tmp", "w") as fh:
                    fh.write("%d\n" % self.api.pid)
                os.replace(path + ".tmp", path)
                self.pid_file: Optional[str] = path
            except OSError:
                self.pid_file = None

    def gpu_entries(self, per_gpu_mib: float) -> None:
        entries = []
        for i, proc in enumerate(self.workers):
            if proc.alive and i < self.gpu_count:
                entries.append(
                    {
                        "pid": proc.pid,
                        "name": "VLLM::" + self.worker_name(i),
                        "gpus": [i],
                        "used_memory_mib": int(per_gpu_mib),
                    }
                )
        self.gpus.update(self.api.pid, entries)

    # -- the load -------------------------------------------------------------------------
    def load(self) -> None:
        self.init_device()
        self.load_weights()
        if self.drafter is not None:
            self.load_drafter()
        self.check_eagle3()
        self.say("model_loading", (self.weights_gib(), time.monotonic() - self.load_started))
        if self.is_multimodal():
            self.say("encoder_cache", (16384, 1, "image"), procs=self.workers)
        self.compile()
        self.kv_cache()
        self.capture_graphs()
        self.say(
            "init_engine",
            (time.monotonic() - self.init_started,),
            labels={
                "took": time.monotonic() - self.init_started,
                "compilation": self.compile_seconds,
                "language model": self.compile_seconds,
                "encoder": 0.0,
            },
        )

    def init_device(self) -> None:
        self.phase = "init_device"
        self.init_started = time.monotonic()
        world = self.tp * self.pp
        first = self.nodes.rank0
        method = "tcp://127.0.0.1:%d" % (29500 + os.getpid() % 20000)
        if self.nodes.multinode:
            method = "tcp://%s:%d" % (self.nodes.master_addr, self.nodes.master_port)
        self.nodes.rendezvous()
        self.nodes.ray_place()
        self.say(
            "world",
            per_proc=lambda i, p: ((world, first + i, i, method, "nccl"), None),
        )
        if self.knobs.get("fault") == "nccl":
            self.fail_workers(
                "init_device",
                self.src.chain(
                    [
                        (
                            ("distributed/device_communicators/pynccl.py",),
                            "__init__",
                            "ncclCommInitRank(",
                            None,
                        ),
                        (
                            ("distributed/device_communicators/pynccl_wrapper.py",),
                            "ncclCommInitRank",
                            "self.NCCL_CHECK(",
                            "NCCL_CHECK",
                        ),
                        (
                            ("distributed/device_communicators/pynccl_wrapper.py",),
                            "NCCL_CHECK",
                            "raise RuntimeError(",
                            None,
                        ),
                    ]
                ),
                "RuntimeError: NCCL error: unhandled system error "
                "(run with NCCL_DEBUG=INFO for details)",
                self.workers,
            )
        self.say("nccl", (SIM_NCCL_VERSION,))
        self.check_free_memory()
        self.say(
            "rank",
            per_proc=lambda i, p: (
                None,
                {
                    "rank": first + i,
                    "world size": world,
                    "dp rank": 0,
                    "pp rank": (first + i) // self.tp,
                    "pcp rank": 0,
                    "tp rank": (first + i) % self.tp,
                    "etp rank": "N/A",
                    "ep rank": (first + i) % self.tp,
                    "eplb rank": "N/A",
                },
            ),
        )
        self.sleep("init_device")
        for i, proc in enumerate(self.workers):
            proc.decorate(self.worker_name(first + i), self.family["worker_prefix"])

    def check_free_memory(self) -> None:
        used = self.gpus.used_by_others(self.api.pid)
        total = self.gpu_total_mib * MIB
        requested = self.util * total
        short = [
            i
            for i in range(min(len(self.workers), self.gpu_count))
            if total - used[i] * MIB < requested
        ]
        if not short:
            return
        procs = [self.workers[i] for i in short]

        def message(i: int) -> str:
            free = total - used[i] * MIB
            return self.src.message(
                ("v1/worker/utils.py", "v1/worker/gpu_worker.py"),
                "is less than desired GPU memory utilization",
                {
                    "device_": "cuda:%d" % i,
                    "device": "cuda:%d" % i,
                    "free_memory": gib(free),
                    "total_memory": gib(total),
                    "gpu_memory_utilization": self.util,
                    "requested_memory": gib(requested),
                    "GiB_bytes": 1,
                },
                "Free memory on device cuda:%d (%s/%s GiB) on startup is less than desired GPU "
                "memory utilization (%s, %s GiB). Decrease GPU memory utilization or reduce GPU "
                "memory used by other processes."
                % (i, gib(free), gib(total), self.util, gib(requested)),
            )

        frames = self.src.chain(
            [
                (("v1/worker/gpu_worker.py",), "init_device", "request_memory(", "request_memory"),
                (("v1/worker/utils.py",), "request_memory", "raise ValueError(", None),
            ]
        )
        self.fail_workers(
            "init_device",
            frames,
            None,
            procs,
            per_worker=lambda i: "ValueError: " + message(short[i]),
        )

    def weights_gib(self) -> float:
        return gib(self.target_bytes() + (self.drafter_bytes() if self.drafter else 0))

    def target_bytes(self) -> float:
        size = self.target.total_size or 595 * 10**9
        return size / max(1, self.tp * self.pp)

    def drafter_bytes(self) -> float:
        if self.drafter is None:
            return 0.0
        return float(self.drafter.total_size or 2 * GIB)

    def bar_format(self) -> Optional[str]:
        return string_constant(
            self.pkg, "model_executor/model_loader/weight_utils.py", "_BAR_FORMAT"
        )

    def weight_bar(
        self, proc: SimProcess, total: int, seconds: float, label: str, fault_at: Optional[int]
    ) -> None:
        """The safetensors bar of one checkpoint on TP0's stderr, a shard per update."""
        fmt = self.bar_format() or SIM_BAR_FORMAT
        bar = Tqdm(proc.stderr, "Loading safetensors checkpoint shards", total, fmt, mininterval=0)
        step = seconds / max(1, total)
        per_shard = self.target_bytes() / max(1, total) / MIB if label == "target" else 0
        for n in range(1, total + 1):
            self.pause(step)
            if fault_at is not None and n == fault_at:
                self.weights_fault(proc, bar, n, total)
            bar.update(1)
            if label == "target":
                self.gpu_entries(per_shard * n + 900)
        bar.close()

    def weights_fault(self, proc: SimProcess, bar: Tqdm, n: int, total: int) -> None:
        fault = self.knobs.get("fault")
        if fault == "stall" and self.knobs.get("fault_phase", "weights") == "weights":
            self.stall()
        if fault == "oom":
            rank = int(self.knobs.get("oom_rank") or 0)
            target = self.workers[min(rank, len(self.workers) - 1)]
            total_gib = gib(self.gpu_total_mib * MIB)
            frames = self.src.chain(
                [
                    (
                        (RUNNER,),
                        "load_model",
                        "self.model = model_loader.load_model(",
                        "load_model",
                    ),
                    (
                        ("model_executor/model_loader/base_loader.py",),
                        "load_model",
                        "self.load_weights(",
                        "load_weights",
                    ),
                    (
                        ("model_executor/model_loader/default_loader.py",),
                        "load_weights",
                        "model.load_weights(",
                        "load_weights",
                    ),
                    (
                        ("model_executor/models/deepseek_v2.py",),
                        "load_weights",
                        "weight_loader(",
                        None,
                    ),
                ]
            )
            exc = (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU %d "
                "has a total capacity of %.2f GiB of which 1.02 GiB is free. Including non-PyTorch "
                "memory, this process has %.2f GiB memory in use. Of the allocated memory %.2f GiB "
                "is allocated by PyTorch, and 112.05 MiB is reserved by PyTorch but unallocated. "
                "If "
                "reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                "documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
                % (rank, total_gib, total_gib - 1.02, total_gib - 1.5)
            )
            self.fail_workers("load_model", frames, exc, [target])
        if fault == "truncated-line":
            # the next update written in two parts (a reader sees a partial line)
            text = "\r" + bar.desc + ": "
            proc.stderr(text)
            self.pause(float(self.knobs.get("truncate_pause_s") or 1.0))
            if self.knobs.get("truncate_then") == "kill":
                self.cleanup()
                os.killpg(os.getpgrp(), signal.SIGKILL)
            bar.write = self._strip_once(bar, text, proc)

    def _strip_once(self, bar: Tqdm, already: str, proc: SimProcess) -> Any:
        state = {"done": False}

        def write(s: str) -> None:
            if not state["done"] and s.startswith(already):
                state["done"] = True
                s = s[len(already) :]
            proc.stderr(s)

        return write

    def stall(self) -> None:
        """Output stops; the process stays (until signalled)."""
        self.phase = "stalled"
        while True:
            time.sleep(0.2)

    def load_weights(self) -> None:
        self.phase = "weights"
        self.load_started = time.monotonic()
        self.say("load_start", (self.model_path,))
        self.say("attn", self.attn_args(mla=self.is_mla()))
        if self.is_int4():
            self.say("moe", (), procs=self.workers)
        shards = len(self.target.shards) or 64
        fault_at = None
        fault = self.knobs.get("fault")
        here = fault != "stall" or self.knobs.get("fault_phase", "weights") == "weights"
        if fault in ("oom", "stall", "truncated-line") and here:
            at = self.knobs.get("fault_at_shard")
            fault_at = int(at) if at is not None else max(1, shards // 3)
        started = time.monotonic()
        self.weight_bar(
            self.workers[0],
            shards,
            self.load_seconds * dict(SIM_PHASES)["weights"],
            "target",
            fault_at,
        )
        self.say("weights_took", (time.monotonic() - started,))

    def attn_args(self, mla: bool) -> Tuple[Any, ...]:
        found = self.src.msg("attn")
        names = SIM_ATTN_MLA if mla else SIM_ATTN
        if found is not None and not found["fmt"].rstrip().endswith("."):
            return (names[0], tuple(names))
        return (names[0], names)

    def is_mla(self) -> bool:
        return bool(self.target.get("kv_lora_rank"))

    def is_int4(self) -> bool:
        quant = self.target.config.get("quantization_config") or self.target.text.get(
            "quantization_config"
        )
        return isinstance(quant, dict) and quant.get("quant_method") == "compressed-tensors"

    def is_multimodal(self) -> bool:
        return supports_multimodal(model_classes_all(self.pkg)["files"], self.target.arch)

    def load_drafter(self) -> None:
        self.phase = "drafter"
        drafter = self.drafter
        assert drafter is not None
        self.say("drafter", ())
        self.say("attn", self.attn_args(mla=False))
        started = time.monotonic()
        self.weight_bar(
            self.workers[0],
            max(1, len(drafter.shards)),
            self.load_seconds * dict(SIM_PHASES)["drafter"] * 0.6,
            "drafter",
            None,
        )
        self.say("weights_took", (time.monotonic() - started,))
        self.check_image_token()
        if drafter.tensors:
            embed = (
                "Detected EAGLE model with distinct embed_tokens weights"
                if drafter.has_tensor("embed_tokens.weight")
                else None
            )
            head = drafter.has_tensor("lm_head.weight")
        else:
            embed, head = "x", True
        if embed:
            self.say("eagle_embed", ())
        else:
            self.say_sharing("embed_tokens")
        if head:
            self.say("eagle_lm_head", ())
        else:
            self.say_sharing("lm_head")
        self.sleep("drafter", 0.4)

    def say_sharing(self, what: str) -> None:
        needle = "Detected EAGLE model without its own %s" % what
        found = find_log_call(self.pkg, list(PROPOSERS), [needle])
        if found is not None and found["level"] != "DEBUG":
            for proc in self.workers:
                proc.log(found["level"], found["basename"], found["line"], found["fmt"])

    def check_image_token(self) -> None:
        """The proposer's multimodal branch, followed for this target class."""
        if not self.is_multimodal():
            return
        found = multimodal_image_token(self.pkg, self.target.arch)
        if found is None:
            return
        obj: Any = self.target.config
        for attr in found["path"]:
            if isinstance(obj, dict) and attr in obj:
                obj = obj[attr]
                continue
            cls = config_registry(self.pkg).get(self.target.model_type, "PretrainedConfig")
            frames = self.src.chain(
                [((RUNNER,), "load_model", "self.drafter.load_model(", "load_model")]
            )
            rel = found["file"]
            src_line = self.src.frame(
                (rel,),
                found["func"].rsplit(".", 1)[-1],
                "target_model.config." + ".".join(found["path"]),
            )
            if src_line is not None:
                frames.append(src_line)
            else:
                frames.append(Frame(self.src.path(rel), found["line"], "load_model", ""))
            self.fail_workers(
                "load_model",
                frames,
                "AttributeError: '%s' object has no attribute '%s'" % (cls, attr),
                self.workers,
            )

    def check_eagle3(self) -> None:
        """gpu_model_runner.load_model: `supports_eagle3(self.get_model())` on the OUTER
        class when EAGLE-3 asks for aux hidden states."""
        if self.drafter is None or self.method != "eagle3":
            return
        judged = find_class(model_classes_all(self.pkg)["files"], self.target.arch)
        if judged is not None and judged["supported"]:
            ids = self.drafter.aux_layer_ids(self.v)
            if ids is not None:
                self.say("aux_layers", (tuple(ids),), procs=self.workers)
            self.aux_ids = ids or [2, self.target.layers // 2, self.target.layers - 3]
            return
        found = self.src.raise_site((RUNNER,), "does not support EAGLE3 interface")
        frames = []
        if found is not None:
            frames.append(Frame(self.src.path(RUNNER), found["line"], found["func"], found["text"]))
        self.fail_workers(
            "load_model",
            frames,
            "RuntimeError: Model does not support EAGLE3 interface but "
            "aux_hidden_state_outputs was requested",
            self.workers,
        )

    def compile(self) -> None:
        self.phase = "compile"
        started = time.monotonic()
        home = os.path.expanduser("~")
        tag = "%010x" % (abs(hash(self.model_path + self.version)) % (1 << 40))
        parts = ["backbone"] + (["eagle_head"] if self.drafter is not None else [])
        for part in parts:
            path = os.path.join(home, ".cache/vllm/torch_compile_cache", tag, "rank_0_0", part)
            self.say("compile_cache", (path,), labels={"": "", "cache directory": path})
            self.sleep("compile", 0.2)
            self.say(
                "dynamo",
                (time.monotonic() - started,),
                labels={"": "", "transform time": time.monotonic() - started},
            )
            if part == "eagle_head":
                self.check_drafter_shapes()
            self.sleep("compile", 0.3)
            rng = "(1, %d)" % int(self.args.get("max_num_batched_tokens") or 8192)
            self.say(
                "compile_range",
                (rng, time.monotonic() - started),
                labels={"": "", "compile range": rng, "takes": time.monotonic() - started},
            )
        if self.knobs.get("fault") == "stall" and self.knobs.get("fault_phase") == "compile":
            self.stall()
        self.compile_seconds = time.monotonic() - started
        self.say("compile_total", (self.compile_seconds,))
        self.say(
            "warmup", (self.compile_seconds,), labels={"": "", "run took": self.compile_seconds}
        )

    def check_drafter_shapes(self) -> None:
        """The drafter's first forward (the profile run): its fc expects
        3 x its hidden size, the target gives 3 x the target's; fewer aux states when an
        aux layer id is out of range. (vLLM checks neither; docs/research/vllm-serve.md §5.3.)"""
        drafter = self.drafter
        if drafter is None or self.method != "eagle3":
            return
        target_hidden = int(self.target.get("hidden_size", 0) or 0)
        hidden = int(drafter.get("target_hidden_size", 0) or drafter.get("hidden_size", 0) or 0)
        ids = getattr(self, "aux_ids", None) or []
        valid = [i for i in ids if 0 <= i < max(1, self.target.layers)]
        if hidden == target_hidden and len(valid) == len(ids):
            return
        tokens = int(self.args.get("max_num_batched_tokens") or 8192)
        got = target_hidden * len(valid)
        frames = self.src.chain(
            [
                ((EXECUTOR,), "worker_busy_loop", "output = func(", "func"),
                (
                    ("v1/worker/gpu_worker.py",),
                    "determine_available_memory",
                    "self.model_runner.profile_run()",
                    "profile_run",
                ),
                ((RUNNER,), "profile_run", "self._dummy_run(", "_dummy_run"),
                ((RUNNER,), "_dummy_run", "self.drafter.dummy_run(", "dummy_run"),
                (PROPOSERS, "dummy_run", "self.model(", None),
                (
                    ("model_executor/models/llama_eagle3.py",),
                    "LlamaForCausalLMEagle3.forward",
                    "self.model(",
                    None,
                ),
                (
                    ("model_executor/models/llama_eagle3.py",),
                    "LlamaModel.forward",
                    "self.fc(",
                    None,
                ),
            ]
        )
        frames.append(
            Frame(
                site_path("torch/nn/modules/module.py"),
                1775,
                "_wrapped_call_impl",
                "        return self._call_impl(*args, **kwargs)",
            )
        )
        frames.append(
            Frame(
                site_path("torch/nn/modules/module.py"),
                1786,
                "_call_impl",
                "        return forward_call(*args, **kwargs)",
            )
        )
        shapes = "%dx%d and %dx%d" % (tokens, got, 3 * hidden, hidden)
        exc = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (%s)" % shapes
        self.fail_profile(frames, exc)

    def fail_profile(self, frames: List[Frame], exc: str) -> None:
        """A worker error in an RPC after start-up (the profile run): each worker logs
        "WorkerProc hit an exception.", the EngineCore's collective_rpc raises."""
        found = find_log_call(self.pkg, [EXECUTOR], ["WorkerProc hit an exception."])
        for proc in self.workers:
            if found is not None:
                proc.log(
                    "ERROR",
                    found["basename"],
                    found["line"],
                    found["fmt"] + "\n" + traceback_text(frames, exc),
                )
        detail = exc.split(": ", 1)[1]
        msg = self.src.message(
            (EXECUTOR,),
            "Worker failed with error",
            {"result": detail},
            "Worker failed with error %r, please check the stack trace above for the root cause"
            % detail,
        )
        core = sim_kv_init_frames(
            self.src,
            [
                (
                    (CORE,),
                    "_initialize_kv_caches",
                    "determine_available_memory()",
                    "determine_available_memory",
                ),
                (
                    ("v1/executor/abstract.py",),
                    "determine_available_memory",
                    "return self.collective_rpc(",
                    "collective_rpc",
                ),
            ],
        )
        site = self.src.raise_site((EXECUTOR,), "Worker failed with error")
        if site is not None:
            core.append(Frame(self.src.path(EXECUTOR), site["line"], site["func"], site["text"]))
        self.fail_engine(core, "RuntimeError: " + msg)

    def kv_cache(self) -> None:
        self.phase = "kv"
        self.sleep("kv", 0.5)
        total = self.gpu_total_mib * MIB
        requested = self.util * total
        activation = 6.2 * GIB
        graphs = 3.4 * GIB if self.v >= (0, 21) else 0.0
        if self.v >= (0, 21):
            # CUDA-graph memory profiling is the default from 0.21 (gpu_worker.py)
            self.say("cg_profiling", ("{'mixed prefill-decode': 51, 'decode': 35}",))
            self.say("cg_estimate", (graphs / GIB,))
        kv = requested - self.target_bytes() - self.drafter_bytes() - activation - graphs
        self.kv_bytes = max(0.0, kv)
        self.say("kv_memory", (gib(self.kv_bytes),))
        self.gpu_entries(requested / MIB * 0.97)
        if kv <= 0:
            self.fail_kv(
                "No available memory for the cache blocks",
                {},
                "ValueError: No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine.",
            )
        per_token = self.kv_bytes_per_token()
        tokens = int(self.kv_bytes // per_token) // 16 * 16
        needed = per_token * self.max_model_len
        if tokens < self.max_model_len:
            estimated = tokens
            msg = self.src.message(
                ("v1/core/kv_cache_utils.py",),
                "To serve at least one request with the models",
                {
                    "max_model_len": self.max_model_len,
                    "needed_memory": needed / GIB,
                    "available_memory": self.kv_bytes / GIB,
                    "estimated_max_len": estimated,
                    "GiB_bytes": 1,
                },
                "To serve at least one request with the models's max seq len (%d), (%.2f GiB KV "
                "cache is needed, which is larger than the available KV cache memory (%.2f GiB)."
                % (self.max_model_len, needed / GIB, self.kv_bytes / GIB),
            )
            self.fail_kv("max seq len", {}, "ValueError: " + msg)
        conc = tokens / float(self.max_model_len)
        found = self.src.msg("kv_size")
        merged = found is not None and "Maximum concurrency" in found["fmt"]
        self.say(
            "kv_size",
            (f"{tokens:,}",),
            labels={
                "": "GPU",
                "kv cache size": f"{tokens:,}",
                "maximum concurrency for": f"{self.max_model_len:,}",
                "tokens per request": conc,
            },
        )
        if not merged:
            self.say("kv_concurrency", (f"{self.max_model_len:,}", conc))
        self.kv_tokens = tokens
        self.sleep("kv", 0.5)

    def kv_bytes_per_token(self) -> float:
        layers = max(1, self.target.layers or 61)
        if self.is_mla():
            width = int(self.target.get("kv_lora_rank", 512)) + int(
                self.target.get("qk_rope_head_dim", 64)
            )
            return float(width * 2 * layers)
        heads = int(self.target.get("num_key_value_heads", 8) or 8)
        head_dim = int(self.target.get("head_dim", 128) or 128)
        return float(2 * max(1, heads // max(1, self.tp)) * head_dim * 2 * layers)

    def fail_kv(self, needle: str, values: Dict[str, Any], exc: str) -> None:
        core = sim_kv_init_frames(
            self.src,
            [
                ((CORE,), "_initialize_kv_caches", "get_kv_cache_config", None),
                (
                    ("v1/core/kv_cache_utils.py",),
                    "get_kv_cache_configs",
                    "check_enough_kv_cache_memory(",
                    "check_enough_kv_cache_memory",
                ),
            ],
        )
        site = self.src.raise_site(("v1/core/kv_cache_utils.py",), needle)
        if site is not None:
            core.append(
                Frame(
                    self.src.path("v1/core/kv_cache_utils.py"),
                    site["line"],
                    site["func"],
                    site["text"],
                )
            )
        self.fail_engine(core, exc)

    def capture_graphs(self) -> None:
        self.phase = "graphs"
        started = time.monotonic()
        if self.knobs.get("fault") == "stall" and self.knobs.get("fault_phase") == "graphs":
            self.stall()
        desc = None
        found = None
        found = find_string(self.pkg, RUNNER, "Capturing CUDA graphs")
        desc = found["text"] if found is not None else "Capturing CUDA graphs ({}, {})"
        if not bool(self.args.get("enforce_eager")):
            seconds = self.load_seconds * dict(SIM_PHASES)["graphs"] * 0.9
            total_items = sum(n for _a, _b, n in SIM_GRAPH_SIZES)
            for kind, mode, count in SIM_GRAPH_SIZES:
                text = desc.replace("{}", kind, 1).replace("{}", mode, 1)
                proc = self.workers[0]
                bar = Tqdm(proc.stderr, text, count, None, mininterval=0)
                for _ in range(count):
                    self.pause(seconds / total_items)
                    bar.update(1)
                bar.close()
            self.say("graphs_done", (time.monotonic() - started, 3.4))
        self.gpu_entries(self.util * self.gpu_total_mib)

    # -- failures -------------------------------------------------------------------------
    def fail_workers(
        self,
        step: str,
        frames: List[Frame],
        exc: Optional[str],
        procs: List[SimProcess],
        per_worker: Optional[Any] = None,
    ) -> None:
        """`exc` raised in `procs` during `step` of WorkerProc.__init__: each logs
        "WorkerProc failed to start." with the traceback; the EngineCore then fails."""
        top = sim_worker_frames(self.src, step)
        for i, proc in enumerate(procs):
            text = exc if per_worker is None else per_worker(i)
            body = traceback_text(top + frames, text or "")
            found = self.src.msg("worker_failed")
            if found is not None:
                proc.log(
                    found["level"], found["basename"], found["line"], found["fmt"] + "\n" + body
                )
        self.pause(0.05)
        wrapped = self.src.message(
            (EXECUTOR,),
            "WorkerProc initialization failed due to",
            {},
            "WorkerProc initialization failed due to an exception in a background process. "
            "See stack trace for root cause.",
        )
        self.fail_engine(sim_core_frames(self.src), "Exception: " + wrapped)

    def fail_engine(self, frames: List[Frame], exc: str) -> None:
        """The EngineCore logs "EngineCore failed to start." with its traceback, re-raises
        (multiprocessing prints it again under "Process EngineCore_DP0:") and exits 1; the
        APIServer raises "Engine core initialization failed"; exit 1."""
        engine = self.engine
        if engine is not None:
            found = self.src.msg("core_failed")
            if found is not None:
                engine.log(
                    found["level"],
                    found["basename"],
                    found["line"],
                    found["fmt"] + "\n" + traceback_text(frames, exc),
                )
            again = list(sim_bootstrap_frames())
            reraise = self.src.frame((CORE,), "run_engine_core", "raise e", None)
            if reraise is not None:
                again.append(reraise)
            again += frames
            engine.stderr(
                "Process %s:\n" % self.family["engine_name"] + traceback_text(again, exc) + "\n"
            )
        for proc in self.workers:
            if proc.child is not None:
                proc.child.exit(1)
        if engine is not None and engine.child is not None:
            engine.child.exit(1, clear=True)
        self.gpus.update(self.api.pid, [])
        self.pause(0.05)
        failed = {self.family["engine_name"]: 1}
        msg = self.src.message(
            ("v1/engine/utils.py",),
            "Engine core initialization failed",
            {"finished": failed},
            "Engine core initialization failed. See root cause above. Failed core proc(s): %s"
            % failed,
        )
        top = (
            sim_api_top(self.src, self.bin_path)
            + sim_engine_client(self.src)
            + sim_launch_frames(self.src)
        )
        site = self.src.raise_site(("v1/engine/utils.py",), "Engine core initialization failed")
        if site is not None:
            top.append(
                Frame(self.src.path("v1/engine/utils.py"), site["line"], site["func"], site["text"])
            )
        self.api.stderr(traceback_text(top, "RuntimeError: " + msg) + "\n")
        raise SimExit(1)

    def report_terminated(self, ctrl_c: bool = False) -> None:
        """SIGTERM while loading: `raise KeyboardInterrupt("terminated")` in the
        APIServer, which waits for the engine; the process dies by SIGINT."""
        frames = sim_api_top(self.src, self.bin_path)
        if self.phase not in ("start",):
            frames += sim_engine_client(self.src) + sim_launch_frames(self.src)
            frames += self.src.chain(
                [(("v1/engine/utils.py",), "wait_for_engine_startup", "poller.poll(", "poll")]
            )
            frames.append(
                Frame(
                    site_path("zmq/sugar/poll.py"),
                    106,
                    "poll",
                    "        return zmq_poll(self.sockets, timeout=timeout)",
                    None,
                )
            )
        if ctrl_c:
            self.api.stderr(traceback_text(frames, "KeyboardInterrupt") + "\n")
            return
        handler = self.src.frame(API_SERVER, "signal_handler", "raise KeyboardInterrupt(", None)
        if handler is not None:
            frames.append(handler)
        self.api.stderr(traceback_text(frames, "KeyboardInterrupt: terminated") + "\n")

    # -- serving --------------------------------------------------------------------------
    def serve_http(self) -> None:
        self.phase = "api"
        self.say("tasks", (["generate"],))
        host = self.host_addr or "0.0.0.0"
        url = "http://%s:%d" % ("[%s]" % host if ":" in host else host, self.port)
        found = self.src.msg("server_start")
        if found is not None and "%d" in found["fmt"]:
            self.say("server_start", (0, url))
        else:
            self.say("server_start", (url,))
        self.say("routes", ())
        for path, methods in SIM_ROUTES:
            self.say("route", (path, methods))
        self.sleep("api")
        # serve_http installed its SIGINT/SIGTERM handlers (a graceful shutdown) before
        # uvicorn starts: from here a SIGTERM is no KeyboardInterrupt any more
        self.ready = True
        signal.signal(signal.SIGINT, self._on_sigterm)
        self.api.stderr("INFO:     Started server process [%d]\n" % self.api.pid)
        self.api.stderr("INFO:     Waiting for application startup.\n")
        definitions = metric_definitions(self.pkg, "v1/spec_decode/metrics.py")
        definitions += metric_definitions(self.pkg, "v1/metrics/loggers.py")
        metrics = SimMetrics(
            definitions, self.served[0], self.k, float(self.knobs.get("acceptance_rate") or 0.0)
        )
        quiet = []
        if self.args.get("disable_uvicorn_access_log"):
            quiet = [r[0] for r in SIM_ROUTES]
        endpoints = self.args.get("disable_access_log_for_endpoints")
        if endpoints:
            quiet += [p.strip() for p in str(endpoints).split(",")]
        self.app = SimApp(
            self.served,
            self.model_path,
            self.max_model_len,
            self.api_keys,
            self.version,
            metrics,
            lambda line: self.api.stdout(line + "\n"),
            quiet,
            self.family["health_dead_status"],
            float(self.knobs.get("http_delay_s") or 0.0),
            timing={
                "step_ms": float(self.knobs.get("step_ms") or 0.0),
                "prefill_ms_per_token": float(self.knobs.get("prefill_ms_per_token") or 0.0),
                "draft_cost": float(self.knobs.get("draft_cost") or 0.0) * self.k,
            },
        )
        self.api.stderr("INFO:     Application startup complete.\n")
        assert self.sock is not None
        self.server = sim_serve(self.sock, self.app)
        self.phase = "ready"

    def serve_forever(self) -> int:
        crash_at = None
        if self.knobs.get("fault") == "crash-after-ready":
            crash_at = time.monotonic() + float(self.knobs.get("crash_after_s") or 0.0)
        while True:
            if self.terminated:
                return self.shutdown(signalled=True)
            if self.nodes.lost:
                self.app.dead = True
                self.node_lost()
            if crash_at is not None and time.monotonic() >= crash_at:
                return self.engine_death()
            time.sleep(0.05)

    def engine_death(self) -> int:
        """The engine dies after start-up: /health 503; the watchdog stops uvicorn within
        VLLM_WATCHDOG_TIME_S; the server exits 0 (vllm#48966)."""
        engine = self.engine
        if self.knobs.get("crash") == "worker" and len(self.workers) > 3:
            worker = self.workers[3]
            if worker.child is not None:
                worker.child.kill(signal.SIGKILL)
            self.say(
                "worker_died",
                ("VllmWorker-3",),
                labels={"worker proc": "VllmWorker-3", "exit code": -9},
            )
        if engine is not None and engine.child is not None:
            for proc in self.workers:
                if proc.child is not None and proc.child.alive:
                    proc.child.exit(0)
            engine.child.kill(signal.SIGKILL)
        self.gpus.update(self.api.pid, [])
        self.app.dead = True
        self.say("core_died", (self.family["engine_name"],))
        watchdog = float(self.knobs.get("watchdog_s") or 0.0)
        deadline = time.monotonic() + watchdog
        while time.monotonic() < deadline and not self.terminated:
            time.sleep(0.05)
        return self.shutdown(signalled=self.terminated, finished=True)

    def shutdown(self, signalled: bool, finished: bool = False) -> int:
        if signalled:
            self.say("http_shutdown", ())
        self.api.stderr("INFO:     Shutting down\n")
        server = getattr(self, "server", None)
        if server is not None:
            server.shutdown()
            server.server_close()
        self.api.stderr("INFO:     Waiting for application shutdown.\n")
        self.api.stderr("INFO:     Application shutdown complete.\n")
        if finished:
            self.api.stderr("INFO:     Finished server process [%d]\n" % self.api.pid)
        raise SimExit(0)

    def cleanup(self) -> None:
        nodes = getattr(self, "nodes", None)
        if nodes is not None:
            nodes.close()
        for proc in self.workers + ([self.engine] if self.engine is not None else []):
            if proc.child is not None and proc.child.alive:
                proc.child.exit(0, clear=proc is self.engine)
        try:
            self.gpus.update(self.api.pid, [])
        except Exception:
            pass
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        path = getattr(self, "pid_file", None)
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass
        for proc in self.workers + ([self.engine] if self.engine is not None else []):
            if proc.child is not None:
                if proc is self.engine:
                    try:
                        os.waitpid(proc.child.pid, 0)
                    except ChildProcessError:
                        pass
                proc.child.close()


_CLASSES_CACHE: Dict[str, Any] = {}


def model_classes_all(package_dir: str) -> Dict[str, Any]:
    if package_dir not in _CLASSES_CACHE:
        _CLASSES_CACHE[package_dir] = model_classes(package_dir)
    return _CLASSES_CACHE[package_dir]


def main(argv: List[str]) -> int:
    """`vllm serve MODEL [options]` (and `vllm --version`)."""
    if argv and argv[0] in ("--version", "-v"):
        try:
            print(locate_vllm()["version"])
        except Refused as exc:
            sys.stderr.write(exc.message + "\n")
            return 1
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(
            "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...\n"
        )
        return 0 if argv else 2
    if argv[0] != "serve":
        sys.stderr.write(
            "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...\n"
            "vllm: error: argument subparser: invalid choice: %r (choose from 'chat', "
            "'complete', 'serve', 'bench', 'collect-env', 'run-batch')\n" % argv[0]
        )
        return 2
    try:
        located = locate_vllm()
    except Refused:
        sys.stderr.write(
            "Traceback (most recent call last):\n"
            '  File "%s", line 5, in <module>\n'
            "    from vllm.entrypoints.cli.main import main\n"
            "ModuleNotFoundError: No module named 'vllm'\n" % (sys.argv[0] if sys.argv else "vllm")
        )
        return 1
    return Sim(argv[1:], located).run()

# fleet on-host module: what one run of the rehearsal vLLM holds, and how it speaks and waits.
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# `SimState` is the one object the parts of the simulator share: the host and the knobs
# (~/.fleet-sandbox), the installed vLLM (its source, its version family), the processes
# (the APIServer, the EngineCore, the workers, each a `SimProcess`), the command line
# (vllm_sim.py), the decisions (vllm_sim_config.py), what the load and the KV sizing found
# (vllm_sim_load.py, vllm_sim_kv.py) and the server. Its methods are what every part needs:
# `say` (a message of vLLM's, from the installed source), `sleep`/`pause` (the compressed
# clock, which notices a lost node of a multi-node group) and `cleanup`.
import os
import re
import socket
import sys
import time
from typing import Any, Dict, List, Optional

from fleet.onhost.rehearsal.vllm_sim_http import SimApp
from fleet.onhost.rehearsal.vllm_sim_model import SimModel, sim_read_json
from fleet.onhost.rehearsal.vllm_sim_nodes import SimNodes
from fleet.onhost.rehearsal.vllm_sim_out import (
    Prefixed,
    SimWriter,
    format_record,
    percent_format,
    prefix_text,
    write_fd,
)
from fleet.onhost.rehearsal.vllm_sim_proc import SimChild, SimGpuState
from fleet.onhost.rehearsal.vllm_sim_src import SimSource, sim_family

SIM_STATE_DIR = "~/.fleet-sandbox"
SIM_DEFAULT_LOAD_SECONDS = 20.0
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


class SimProcess:
    """One simulated process: its pid, its prefixed stdout/stderr, who writes its bytes."""

    def __init__(self, sim: "SimState", pid: int, child: Optional[SimChild]) -> None:
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


class SimState:
    """What one run of `vllm serve` holds, and how it speaks and waits."""

    # the command line (vllm_sim.Sim.start)
    argv: List[str]
    args: Dict[str, Any]
    given: List[str]
    model_path: str
    tp: int
    pp: int
    nodes: SimNodes
    served: List[str]
    port: int
    host_addr: str
    util: float
    trust: bool
    api_keys: List[str]
    spec: Any
    # the decisions (vllm_sim_config.configure)
    target: SimModel
    target_max_len: int
    max_model_len: int
    drafter: Optional[SimModel]
    drafter_max_len: int
    k: int
    method: Optional[str]
    # the engine and the load (vllm_sim_load.py, vllm_sim_kv.py)
    worker_pipes: Any
    worker_titles: List[str]
    init_started: float
    load_started: float
    aux_ids: List[int]
    compile_seconds: float
    kv_bytes: float
    kv_tokens: int
    # the server (vllm_sim.Sim)
    pid_file: Optional[str]
    app: SimApp
    server: Any

    def __init__(self, argv: List[str], located: Dict[str, Any], defaults: Dict[str, Any]) -> None:
        self.argv = argv
        self.pkg = located["package_dir"]
        self.version = located["version"]
        self.src = SimSource(self.pkg, self.version)
        self.env = dict(os.environ)
        self.family = sim_family(self.version, self.pkg, self.env, sys.stdout.isatty())
        self.v = self.family["version"]
        self.state_dir = os.path.expanduser(SIM_STATE_DIR)
        self.host = sim_read_json(os.path.join(self.state_dir, "host.json"))
        knobs = dict(defaults)
        knobs.update(sim_read_json(os.path.join(self.state_dir, "sim.json")))
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

    # -- output -------------------------------------------------------------------------
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

    def say_platform(self, proc: SimProcess) -> None:
        # 0.10.x logs "Automatically detected platform cuda." at INFO on import, before
        # decorate_logs, once in every process (DEBUG from 0.11: not printed)
        self.say("platform", ("cuda",), procs=[proc])

    def say_ray(self, key: str, args: Any) -> None:
        self.say(key, args, procs=[self.engine] if self.engine is not None else [self.api])

    def worker_name(self, rank: int) -> str:
        name = "Worker"
        if self.pp > 1:
            name += "_PP%d" % (rank // self.tp)
        if self.tp > 1:
            name += "_TP%d" % (rank % self.tp)
        return name

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

    # -- the clock ----------------------------------------------------------------------
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

    # -- the end ------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Release what the run holds: the children, the GPU entries, the socket, the
        pid file."""
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

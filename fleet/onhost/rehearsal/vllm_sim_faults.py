# fleet on-host module: how the rehearsal vLLM fails, at each point vLLM fails.
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# Each failure prints what vLLM prints there (the tracebacks from the installed source:
# vllm_sim_src.py) and ends the run with vLLM's exit: the bind of the API socket; a worker
# failing in init_device or load_model, the EngineCore failing after it, the APIServer
# last; the profile run and the KV cache sizing (an RPC error, a ValueError); a process
# group that cannot form across nodes. The knobs' faults (~/.fleet-sandbox/sim.json) strike
# while the weights load (oom, stall, truncated-line); after ready the engine can die; a
# SIGTERM while loading is vLLM's KeyboardInterrupt("terminated"). A node lost later is
# noticed by the clock (vllm_sim_state.SimState.node_lost).
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional

from fleet.onhost.rehearsal.source_mining import find_line, find_log_call
from fleet.onhost.rehearsal.vllm_sim_out import Frame, Tqdm, traceback_text
from fleet.onhost.rehearsal.vllm_sim_src import (
    API_SERVER,
    CORE,
    EXECUTOR,
    RUNNER,
    sim_api_top,
    sim_bootstrap_frames,
    sim_core_frames,
    sim_engine_client,
    sim_kv_init_frames,
    sim_launch_frames,
    sim_worker_frames,
    site_path,
)
from fleet.onhost.rehearsal.vllm_sim_state import MIB, SimExit, SimProcess, SimState, gib


def fail_bind(sim: SimState) -> None:
    frames = sim_api_top(sim.src, sim.bin_path)
    frames += sim.src.chain(
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
    sim.api.stderr(traceback_text(frames, "OSError: [Errno 98] Address already in use") + "\n")
    raise SimExit(1)


def fail_rendezvous(sim: SimState, exc: str) -> None:
    """The process group could not form: torch's error in every local rank's traceback
    (init_distributed_environment), the engine fails, the server exits 1."""
    frames = sim.src.chain(
        [
            (("distributed/parallel_state.py",), "init_distributed_environment",
             "torch.distributed.init_process_group(", None),
        ]
    )  # fmt: skip
    if sim.nodes.headless or not sim.workers:
        target = sim.workers[0] if sim.workers else sim.api
        target.stderr(traceback_text(frames, exc) + "\n")
        raise SimExit(1)
    fail_workers(sim, "init_device", frames, exc, sim.workers[:1])


def fail_workers(
    sim: SimState,
    step: str,
    frames: List[Frame],
    exc: Optional[str],
    procs: List[SimProcess],
    per_worker: Optional[Any] = None,
) -> None:
    """`exc` raised in `procs` during `step` of WorkerProc.__init__: each logs
    "WorkerProc failed to start." with the traceback; the EngineCore then fails."""
    top = sim_worker_frames(sim.src, step)
    for i, proc in enumerate(procs):
        text = exc if per_worker is None else per_worker(i)
        body = traceback_text(top + frames, text or "")
        found = sim.src.msg("worker_failed")
        if found is not None:
            proc.log(found["level"], found["basename"], found["line"], found["fmt"] + "\n" + body)
    sim.pause(0.05)
    wrapped = sim.src.message(
        (EXECUTOR,),
        "WorkerProc initialization failed due to",
        {},
        "WorkerProc initialization failed due to an exception in a background process. "
        "See stack trace for root cause.",
    )
    fail_engine(sim, sim_core_frames(sim.src), "Exception: " + wrapped)


def fail_engine(sim: SimState, frames: List[Frame], exc: str) -> None:
    """The EngineCore logs "EngineCore failed to start." with its traceback, re-raises
    (multiprocessing prints it again under "Process EngineCore_DP0:") and exits 1; the
    APIServer raises "Engine core initialization failed"; exit 1."""
    engine = sim.engine
    if engine is not None:
        found = sim.src.msg("core_failed")
        if found is not None:
            engine.log(
                found["level"],
                found["basename"],
                found["line"],
                found["fmt"] + "\n" + traceback_text(frames, exc),
            )
        again = list(sim_bootstrap_frames())
        reraise = sim.src.frame((CORE,), "run_engine_core", "raise e", None)
        if reraise is not None:
            again.append(reraise)
        again += frames
        engine.stderr(
            "Process %s:\n" % sim.family["engine_name"] + traceback_text(again, exc) + "\n"
        )
    for proc in sim.workers:
        if proc.child is not None:
            proc.child.exit(1)
    if engine is not None and engine.child is not None:
        engine.child.exit(1, clear=True)
    sim.gpus.update(sim.api.pid, [])
    sim.pause(0.05)
    failed = {sim.family["engine_name"]: 1}
    msg = sim.src.message(
        ("v1/engine/utils.py",),
        "Engine core initialization failed",
        {"finished": failed},
        "Engine core initialization failed. See root cause above. Failed core proc(s): %s" % failed,
    )
    top = (
        sim_api_top(sim.src, sim.bin_path) + sim_engine_client(sim.src) + sim_launch_frames(sim.src)
    )
    site = sim.src.raise_site(("v1/engine/utils.py",), "Engine core initialization failed")
    if site is not None:
        top.append(
            Frame(sim.src.path("v1/engine/utils.py"), site["line"], site["func"], site["text"])
        )
    sim.api.stderr(traceback_text(top, "RuntimeError: " + msg) + "\n")
    raise SimExit(1)


def fail_profile(sim: SimState, frames: List[Frame], exc: str) -> None:
    """A worker error in an RPC after start-up (the profile run): each worker logs
    "WorkerProc hit an exception.", the EngineCore's collective_rpc raises."""
    found = find_log_call(sim.pkg, [EXECUTOR], ["WorkerProc hit an exception."])
    text = traceback_text(frames, exc)
    noted = find_line(sim.pkg, EXECUTOR, "worker_busy_loop", "e.add_note(traceback.format_exc())")
    if sys.version_info >= (3, 11) and noted is not None:
        # worker_busy_loop adds the traceback as a note before logger.exception, which
        # prints a note after the exception line (Python 3.11+)
        text += "\n" + text
    for proc in sim.workers:
        if found is not None:
            proc.log("ERROR", found["basename"], found["line"], found["fmt"] + "\n" + text)
    # enqueue_output sends str(exception): '' for a bare `assert`
    detail = exc.split(": ", 1)[1] if ": " in exc else ""
    msg = sim.src.message(
        (EXECUTOR,),
        "Worker failed with error",
        {"result": detail},
        "Worker failed with error %r, please check the stack trace above for the root cause"
        % detail,
    )
    core = sim_kv_init_frames(
        sim.src,
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
    site = sim.src.raise_site((EXECUTOR,), "Worker failed with error")
    if site is not None:
        core.append(Frame(sim.src.path(EXECUTOR), site["line"], site["func"], site["text"]))
    fail_engine(sim, core, "RuntimeError: " + msg)


def fail_kv(sim: SimState, needle: str, values: Dict[str, Any], exc: str) -> None:
    core = sim_kv_init_frames(
        sim.src,
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
    site = sim.src.raise_site(("v1/core/kv_cache_utils.py",), needle)
    if site is not None:
        core.append(
            Frame(
                sim.src.path("v1/core/kv_cache_utils.py"),
                site["line"],
                site["func"],
                site["text"],
            )
        )
    fail_engine(sim, core, exc)


def weights_fault(sim: SimState, proc: SimProcess, bar: Tqdm, n: int, total: int) -> None:
    fault = sim.knobs.get("fault")
    if fault == "stall" and sim.knobs.get("fault_phase", "weights") == "weights":
        stall(sim)
    if fault == "oom":
        rank = int(sim.knobs.get("oom_rank") or 0)
        target = sim.workers[min(rank, len(sim.workers) - 1)]
        total_gib = gib(sim.gpu_total_mib * MIB)
        frames = sim.src.chain(
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
        fail_workers(sim, "load_model", frames, exc, [target])
    if fault == "truncated-line":
        # the next update written in two parts (a reader sees a partial line)
        text = "\r" + bar.desc + ": "
        proc.stderr(text)
        sim.pause(float(sim.knobs.get("truncate_pause_s") or 1.0))
        if sim.knobs.get("truncate_then") == "kill":
            sim.cleanup()
            os.killpg(os.getpgrp(), signal.SIGKILL)
        bar.write = _strip_once(bar, text, proc)


def _strip_once(bar: Tqdm, already: str, proc: SimProcess) -> Any:
    state = {"done": False}

    def write(s: str) -> None:
        if not state["done"] and s.startswith(already):
            state["done"] = True
            s = s[len(already) :]
        proc.stderr(s)

    return write


def stall(sim: SimState) -> None:
    """Output stops; the process stays (until signalled)."""
    sim.phase = "stalled"
    while True:
        time.sleep(0.2)


def engine_death(sim: SimState) -> None:
    """The engine dies after start-up: /health 503; the watchdog stops uvicorn within
    VLLM_WATCHDOG_TIME_S (then the server shuts down and exits 0: vllm#48966)."""
    engine = sim.engine
    if sim.knobs.get("crash") == "worker" and len(sim.workers) > 3:
        worker = sim.workers[3]
        if worker.child is not None:
            worker.child.kill(signal.SIGKILL)
        sim.say(
            "worker_died",
            ("VllmWorker-3",),
            labels={"worker proc": "VllmWorker-3", "exit code": -9},
        )
    if engine is not None and engine.child is not None:
        for proc in sim.workers:
            if proc.child is not None and proc.child.alive:
                proc.child.exit(0)
        engine.child.kill(signal.SIGKILL)
    sim.gpus.update(sim.api.pid, [])
    sim.app.dead = True
    sim.say("core_died", (sim.family["engine_name"],))
    watchdog = float(sim.knobs.get("watchdog_s") or 0.0)
    deadline = time.monotonic() + watchdog
    while time.monotonic() < deadline and not sim.terminated:
        time.sleep(0.05)


def report_terminated(sim: SimState, ctrl_c: bool = False) -> None:
    """SIGTERM while loading: `raise KeyboardInterrupt("terminated")` in the
    APIServer, which waits for the engine; the process dies by SIGINT."""
    frames = sim_api_top(sim.src, sim.bin_path)
    if sim.phase not in ("start",):
        frames += sim_engine_client(sim.src) + sim_launch_frames(sim.src)
        frames += sim.src.chain(
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
        sim.api.stderr(traceback_text(frames, "KeyboardInterrupt") + "\n")
        return
    handler = sim.src.frame(API_SERVER, "signal_handler", "raise KeyboardInterrupt(", None)
    if handler is not None:
        frames.append(handler)
    sim.api.stderr(traceback_text(frames, "KeyboardInterrupt: terminated") + "\n")

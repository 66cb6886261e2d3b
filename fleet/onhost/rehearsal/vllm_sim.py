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
#
# This module is the start-up script and the lifecycle (`Sim`); the rest are functions
# over the run's state (vllm_sim_state.SimState): the decisions at config time
# (vllm_sim_config.py), the load (vllm_sim_load.py), the KV cache and CUDA graphs
# (vllm_sim_kv.py), the failures (vllm_sim_faults.py); beside them the command line
# (vllm_sim_args.py), what vLLM's source says (vllm_sim_src.py), the bytes written
# (vllm_sim_out.py), the processes (vllm_sim_proc.py), the HTTP server (vllm_sim_http.py),
# several nodes (vllm_sim_nodes.py) and a model directory (vllm_sim_model.py).
import os
import re
import signal
import sys
import time
from typing import Any, Dict, List

from fleet.onhost._common import Refused, locate_vllm
from fleet.onhost.rehearsal.source_mining import metric_definitions
from fleet.onhost.rehearsal.vllm_sim_args import (
    SIM_USAGE,
    SimArgError,
    sim_field_order,
    sim_parse,
)
from fleet.onhost.rehearsal.vllm_sim_config import configure
from fleet.onhost.rehearsal.vllm_sim_faults import (
    engine_death,
    fail_bind,
    report_terminated,
)
from fleet.onhost.rehearsal.vllm_sim_http import SimApp, SimMetrics, sim_bind, sim_serve
from fleet.onhost.rehearsal.vllm_sim_load import load, start_engine
from fleet.onhost.rehearsal.vllm_sim_nodes import SimNodes
from fleet.onhost.rehearsal.vllm_sim_out import percent_format
from fleet.onhost.rehearsal.vllm_sim_proc import sim_die_by
from fleet.onhost.rehearsal.vllm_sim_src import SIM_ROUTES
from fleet.onhost.rehearsal.vllm_sim_state import SimExit, SimState, SimTerminated

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


class Sim:
    """One run of `vllm serve`: parse, decide, load (compressed), serve, end. The start-up
    script and the lifecycle over the run's state (`self.state`)."""

    def __init__(self, argv: List[str], located: Dict[str, Any]) -> None:
        self.state = SimState(argv, located, SIM_KNOBS)

    def run(self) -> int:
        sim = self.state
        signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            try:
                self.start()
            except SimTerminated:
                report_terminated(sim)
                raise SimExit(130, signal.SIGINT) from None
            except KeyboardInterrupt:
                report_terminated(sim, ctrl_c=True)
                raise SimExit(130, signal.SIGINT) from None
            return self.serve_forever()
        except SimExit as done:
            sim.cleanup()
            if done.sig is not None:
                sim_die_by(done.sig)
            return done.code
        except BaseException:
            sim.cleanup()
            raise

    def _on_sigterm(self, *_: Any) -> None:
        sim = self.state
        if sim.ready:
            sim.terminated = True
            return
        raise SimTerminated()

    def start(self) -> None:
        sim = self.state
        self.register_pid()
        sim.say_platform(sim.api)
        try:
            values, given = sim_parse(sim.pkg, sim.argv)
        except SimArgError as exc:
            sys.stderr.write(SIM_USAGE + "\nvllm serve: error: %s\n" % exc)
            sys.stderr.flush()
            raise SimExit(2) from None
        sim.args = values
        sim.given = given
        sim.model_path = str(values.get("model_tag") or values.get("model") or "")
        if not sim.model_path:
            sys.stderr.write(
                SIM_USAGE + "\nvllm serve: error: the model_tag argument is required\n"
            )
            raise SimExit(2)
        sim.tp = int(values.get("tensor_parallel_size") or 1)
        sim.pp = int(values.get("pipeline_parallel_size") or 1)
        sim.nodes = SimNodes(sim, values)
        sim.served = list(values.get("served_model_name") or [sim.model_path])
        sim.port = int(values.get("port") or 8000)
        sim.host_addr = str(values.get("host") or "")
        sim.util = float(values.get("gpu_memory_utilization") or 0.9)
        sim.trust = bool(values.get("trust_remote_code"))
        given_keys = values.get("api_key")
        if isinstance(given_keys, str):
            given_keys = [given_keys]
        env_key = sim.env.get("VLLM_API_KEY")
        sim.api_keys = list(given_keys or ([env_key] if env_key else []))
        sim.spec = values.get("speculative_config")
        if sim.nodes.headless:
            self.run_headless()
        sim.api.decorate("APIServer")
        self.say_banner()
        sim.say(
            "args",
            (self.non_default_args(),),
        )
        self.bind()
        sim.phase = "config"
        configure(sim)
        sim.sleep("config")
        start_engine(sim)
        load(sim)
        self.serve_http()

    def run_headless(self) -> None:
        """A worker node of vLLM's own multi-node mode: no API server, its ranks only."""
        sim = self.state
        sim.say("headless", (sim.version, sim.nodes.master_addr))
        sim.phase = "config"
        configure(sim)
        start_engine(sim)
        load(sim)
        while not sim.terminated:
            if sim.nodes.lost:
                sim.node_lost()
            time.sleep(0.05)
        raise SimExit(0)

    def say_banner(self) -> None:
        sim = self.state
        if sim.family["logo"]:
            logo = sim.src.logo()
            if logo is not None:
                disabled = sim.env.get("VLLM_DISABLE_LOG_LOGO", "0") not in ("", "0")
                if logo["template"] and not disabled:
                    text = re.sub(r"\$\{?[a-z]\}?", "", logo["template"])
                else:
                    text = logo["plain"] or "vLLM server version %s, serving model %s"
                sim.api.log(
                    "INFO",
                    logo["basename"],
                    logo["line"],
                    percent_format(text, (sim.version, sim.model_path)),
                )
                return
        sim.say("banner_old", (sim.version,))

    def non_default_args(self) -> Dict[str, Any]:
        sim = self.state
        order = sim_field_order(sim.pkg)
        out: Dict[str, Any] = {}
        keys = list(sim.given)
        if "model_tag" in keys and "model" not in keys:
            keys.insert(keys.index("model_tag") + 1, "model")
        rank = {k: i for i, k in enumerate(order)}
        keys.sort(key=lambda k: rank.get(k, len(rank)))
        for key in keys:
            if key == "model":
                out["model"] = sim.model_path
            elif key in sim.args:
                out[key] = sim.args[key]
        return out

    def bind(self) -> None:
        sim = self.state
        if sim.knobs.get("fault") == "port-in-use":
            fail_bind(sim)
        try:
            sim.sock = sim_bind(sim.host_addr, sim.port)
        except OSError:
            fail_bind(sim)

    def register_pid(self) -> None:
        """~/.fleet-sandbox/run/vllm-<pid>.pid: `fleet sandbox down` stops what is left."""
        sim = self.state
        run = os.path.join(sim.state_dir, "run")
        if os.path.isdir(run):
            path = os.path.join(run, "vllm-%d.pid" % sim.api.pid)
            try:
                with open(path + ".tmp", "w") as fh:
                    fh.write("%d\n" % sim.api.pid)
                os.replace(path + ".tmp", path)
                sim.pid_file = path
            except OSError:
                sim.pid_file = None

    def serve_http(self) -> None:
        sim = self.state
        sim.phase = "api"
        sim.say("tasks", (["generate"],))
        host = sim.host_addr or "0.0.0.0"
        url = "http://%s:%d" % ("[%s]" % host if ":" in host else host, sim.port)
        found = sim.src.msg("server_start")
        if found is not None and "%d" in found["fmt"]:
            sim.say("server_start", (0, url))
        else:
            sim.say("server_start", (url,))
        sim.say("routes", ())
        for path, methods in SIM_ROUTES:
            sim.say("route", (path, methods))
        sim.sleep("api")
        # serve_http installed its SIGINT/SIGTERM handlers (a graceful shutdown) before
        # uvicorn starts: from here a SIGTERM is no KeyboardInterrupt any more
        sim.ready = True
        signal.signal(signal.SIGINT, self._on_sigterm)
        sim.api.stderr("INFO:     Started server process [%d]\n" % sim.api.pid)
        sim.api.stderr("INFO:     Waiting for application startup.\n")
        definitions = metric_definitions(sim.pkg, "v1/spec_decode/metrics.py")
        definitions += metric_definitions(sim.pkg, "v1/metrics/loggers.py")
        metrics = SimMetrics(
            definitions, sim.served[0], sim.k, float(sim.knobs.get("acceptance_rate") or 0.0)
        )
        quiet = []
        if sim.args.get("disable_uvicorn_access_log"):
            quiet = [r[0] for r in SIM_ROUTES]
        endpoints = sim.args.get("disable_access_log_for_endpoints")
        if endpoints:
            quiet += [p.strip() for p in str(endpoints).split(",")]
        sim.app = SimApp(
            sim.served,
            sim.model_path,
            sim.max_model_len,
            sim.api_keys,
            sim.version,
            metrics,
            lambda line: sim.api.stdout(line + "\n"),
            quiet,
            sim.family["health_dead_status"],
            float(sim.knobs.get("http_delay_s") or 0.0),
            timing={
                "step_ms": float(sim.knobs.get("step_ms") or 0.0),
                "prefill_ms_per_token": float(sim.knobs.get("prefill_ms_per_token") or 0.0),
                "draft_cost": float(sim.knobs.get("draft_cost") or 0.0) * sim.k,
            },
        )
        sim.api.stderr("INFO:     Application startup complete.\n")
        assert sim.sock is not None
        sim.server = sim_serve(sim.sock, sim.app)
        sim.phase = "ready"

    def serve_forever(self) -> int:
        sim = self.state
        crash_at = None
        if sim.knobs.get("fault") == "crash-after-ready":
            crash_at = time.monotonic() + float(sim.knobs.get("crash_after_s") or 0.0)
        while True:
            if sim.terminated:
                return self.shutdown(signalled=True)
            if sim.nodes.lost:
                sim.app.dead = True
                sim.node_lost()
            if crash_at is not None and time.monotonic() >= crash_at:
                engine_death(sim)
                return self.shutdown(signalled=sim.terminated, finished=True)
            time.sleep(0.05)

    def drain(self) -> None:
        """SIGTERM with ``--shutdown-timeout N`` (0.18+): the engine lets the requests in
        flight finish, for at most N seconds, before the server goes down (0: aborted)."""
        sim = self.state
        timeout = int(sim.args.get("shutdown_timeout") or 0)
        app = getattr(sim, "app", None)
        if timeout <= 0 or app is None:
            return
        sim.say("shutdown_initiated", (timeout,))
        running = app.metrics.running
        if running:
            sim.say("shutdown_draining", (running, timeout))
            deadline = time.monotonic() + timeout
            while app.metrics.running and time.monotonic() < deadline:
                time.sleep(0.05)
        sim.say("shutdown_complete", ())

    def shutdown(self, signalled: bool, finished: bool = False) -> int:
        sim = self.state
        if signalled:
            self.drain()
            sim.say("http_shutdown", ())
        sim.api.stderr("INFO:     Shutting down\n")
        server = getattr(sim, "server", None)
        if server is not None:
            server.shutdown()
            server.server_close()
        sim.api.stderr("INFO:     Waiting for application shutdown.\n")
        sim.api.stderr("INFO:     Application shutdown complete.\n")
        if finished:
            sim.api.stderr("INFO:     Finished server process [%d]\n" % sim.api.pid)
        raise SimExit(0)


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

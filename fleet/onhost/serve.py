# fleet serve helper: runs ON THE HOST in a bundle (see _common.py), one round trip per op.
#
# Operations (request["op"]):
#   preflight  observations for the local preflight rules: the host's home, the installed
#              vLLM and what it says about EAGLE-3 (target class, allowlist, drafter
#              architectures and config types it knows), both config.json files and the
#              weight files next to them, GPUs and their free memory (nvidia-smi), the port
#              (a plain bind(): vLLM binds before it listens), disk, the supervisors this
#              host offers, the profile's server (its supervisor's state, /health, the
#              launch record) and whether another fleet serve holds its lock.
#   launch     under the profile's lock (waited for, bounded): a launch is idempotent by
#              its launch id (a launch retried after a dropped connection finds its own
#              record and starts nothing); a server already running is re-attached to
#              (unless "restart"); else rotate the log, write launch.sh, secrets.env (0600)
#              and the supervisor's file atomically, and start it under the chosen
#              supervisor (fleet/onhost/supervisors.py: fleet's supervisord, or systemd).
#   status     per profile: its supervisor's state, pid, uptime, the log's size and its
#              last bytes (the local phase tracker reads them; "tail": false leaves
#              them out), /health.
#   stop       through the profile's supervisor (TERM to the process group, KILL after the
#              grace period); idempotent; the GPU memory nvidia-smi reports afterwards,
#              and the launch record's node (a server across hosts: rank, role, group).
# Secrets arrive in the request (stdin), are written to a 0600 file and never printed.
import base64
import errno
import json
import os
import socket
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from fleet.onhost._common import find_vllm, hold_on_hangup, vllm_version
from fleet.onhost.files import FileLock, lock_held, replace_file
from fleet.onhost.layout import LOG_NAME, home, profile_name_ok, run_dir, run_root
from fleet.onhost.localhttp import health, metrics
from fleet.onhost.probes import disk_usage, part_gpus, run_captured
from fleet.onhost.supervisors import ACTIVE_STATES, backend, describe_all
from fleet.onhost.vllm_tree import allowlists, model_classes

LOG_TAIL_BYTES = 65536
CONFIG_MAX = 4 * 1024 * 1024
# A launch waits this long for the profile's lock: a launch of the same request still
# finishing after its connection dropped, or another fleet serve/stop of the profile.
LAUNCH_LOCK_WAIT = 120.0
STOP_LOCK_WAIT = 30.0
BUSY = "another fleet serve or stop of this profile is running on this host"

# -- observations ------------------------------------------------------------------------


def _read_json(path: str) -> Dict[str, Any]:
    try:
        if os.path.getsize(path) > CONFIG_MAX:
            return {"error": "larger than %d bytes" % CONFIG_MAX}
        with open(path, "rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
    except FileNotFoundError:
        return {"missing": True}
    except (OSError, ValueError) as exc:
        return {"error": type(exc).__name__ + ": " + str(exc)}
    return {"value": data if isinstance(data, dict) else {}}


def _model_dir(path: str) -> Dict[str, Any]:
    """A model directory: config.json, the weight files it should hold, their sizes."""
    if not path.startswith("/") and not path.startswith("~"):
        return {"hub_id": path}  # downloaded by vLLM: nothing to check on disk
    path = os.path.expanduser(path)
    out: Dict[str, Any] = {"path": path, "exists": os.path.isdir(path)}
    if not out["exists"]:
        return out
    out["config"] = _read_json(os.path.join(path, "config.json"))
    index = _read_json(os.path.join(path, "model.safetensors.index.json"))
    wanted: List[str] = []
    if "value" in index:
        weight_map = index["value"].get("weight_map")
        if isinstance(weight_map, dict):
            wanted = sorted({str(v) for v in weight_map.values()})
    present = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    out["weights"] = {
        "indexed": wanted,
        "present": present[:4096],
        "missing": [n for n in wanted if n not in present][:50],
        "bytes": sum(
            os.path.getsize(os.path.join(path, n))
            for n in present
            if os.path.isfile(os.path.join(path, n))
        ),
    }
    try:
        out["disk"] = disk_usage(path)
    except OSError:
        pass
    return out


def _bind_free(host: str, port: int) -> Dict[str, Any]:
    """A plain bind() (no SO_REUSEADDR/SO_REUSEPORT): the only test that sees a loading
    vLLM, which binds its port long before it listens. A refusal caused only by TIME_WAIT
    connections of a server that stopped (vLLM binds with SO_REUSEADDR: they do not stop
    it) counts as free when no vllm process names the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        return {"free": True}
    except OSError as exc:
        states = _tcp_states(port)
        if (
            exc.errno == errno.EADDRINUSE
            and states
            and set(states) <= {"06"}
            and not _vllm_on_port(port)
        ):
            return {"free": True, "note": "only TIME_WAIT connections on the port"}
        return {"free": False, "errno": exc.errno, "error": os.strerror(exc.errno or 0)}
    finally:
        sock.close()


def _tcp_sockets(port: int) -> List[Tuple[str, str]]:
    """(state in hex, inode) of the TCP sockets whose local port is `port`, from
    /proc/net/tcp and tcp6 (`sl local rem st tx:rx tr:when retrnsmt uid timeout inode`)."""
    found: List[Tuple[str, str]] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    fields = line.split()
                    if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        found.append((fields[3], fields[9]))
        except (OSError, ValueError, StopIteration):
            continue
    return found


def _tcp_states(port: int) -> List[str]:
    """The TCP states (hex) of the sockets whose local port is `port`."""
    return [state for state, _inode in _tcp_sockets(port)]


def _vllm_on_port(port: int) -> bool:
    """Is a vllm process (loading: bound but not listening yet) started for `port`?"""
    wanted = (b"--port\0%d\0" % port, b"--port=%d\0" % port)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                argv = fh.read(16384) + b"\0"
        except OSError:
            continue
        if b"vllm" in argv.lower() and any(w in argv for w in wanted):
            return True
    return False


def _holder_of(port: int) -> Optional[str]:
    """Which process has `port` (from /proc/net/tcp* and /proc/*/fd), best effort."""
    inodes = {inode for _state, inode in _tcp_sockets(port)}
    if not inodes:
        return None
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    with open("/proc/%s/cmdline" % pid, "rb") as fh:
                        argv = fh.read(512).split(b"\0")
                    return "%s (pid %s)" % (
                        os.path.basename(argv[0].decode("utf-8", "replace")),
                        pid,
                    )
        except OSError:
            continue
    return None


def op_preflight(request: Dict[str, Any]) -> Dict[str, Any]:
    profile = request["profile"]
    out: Dict[str, Any] = {"home": home(), "python": sys.executable}
    package_dir = find_vllm()
    out["vllm"] = {"path": package_dir}
    if package_dir:
        version, _source = vllm_version(package_dir)
        out["vllm"]["version"] = version
        out["vllm"]["models"] = model_classes(package_dir)
        out["vllm"]["allowlist"] = allowlists(package_dir)
    out["target"] = _model_dir(str(profile["model"]))
    if profile.get("drafter"):
        out["drafter"] = _model_dir(str(profile["drafter"]))
    if package_dir:
        out["vllm"]["knows"] = _vllm_knows(package_dir, _config_names(out))
    out["gpus"] = part_gpus()
    out["port"] = _bind_free(str(profile.get("host") or "0.0.0.0"), int(profile["port"]))
    if not out["port"]["free"]:
        out["port"]["holder"] = _holder_of(int(profile["port"]))
    try:
        out["disk"] = {"home": disk_usage(out["home"])}
    except OSError as exc:
        out["disk"] = {"error": str(exc)}
    vllm_exe = os.path.expanduser(str(profile["vllm"]))
    out["vllm_executable"] = {
        "path": vllm_exe,
        "ok": os.path.isfile(vllm_exe) and os.access(vllm_exe, os.X_OK),
    }
    if package_dir:
        out["vllm"]["offers"] = _vllm_offers(package_dir)
    if profile.get("node"):
        out["node"] = _node_checks(profile["node"])
    out["supervisors"] = describe_all()
    out["server"] = _profile_state(str(profile["name"]), int(profile["port"]))
    return out


_OFFERS = (
    # what a multi-node start may use, as this vLLM's own source defines it
    ("nnodes", ("engine/arg_utils.py",), '"--nnodes"'),
    (
        "headless",
        (
            "entrypoints/openai/cli_args.py",
            "entrypoints/common/cli_args.py",
            "entrypoints/cli/serve.py",
        ),
        '"--headless"',
    ),
    ("distributed_timeout_seconds", ("engine/arg_utils.py",), '"--distributed-timeout-seconds"'),
    ("engine_ready_timeout", ("envs.py",), '"VLLM_ENGINE_READY_TIMEOUT_S"'),
    # SIGTERM drains in-flight requests for up to N seconds instead of aborting them (0.18+)
    ("shutdown_timeout", ("engine/arg_utils.py",), '"--shutdown-timeout"'),
)


def _vllm_offers(package_dir: str) -> Dict[str, bool]:
    """Which multi-node flags and settings the installed vLLM defines (its source)."""
    out: Dict[str, bool] = {}
    texts: Dict[str, str] = {}
    for key, files, needle in _OFFERS:
        found = False
        for rel in files:
            if rel not in texts:
                try:
                    with open(os.path.join(package_dir, rel), encoding="utf-8") as fh:
                        texts[rel] = fh.read()
                except OSError:
                    texts[rel] = ""
            found = found or needle in texts[rel]
        out[key] = found
    return out


def _node_checks(node: Dict[str, Any]) -> Dict[str, Any]:
    """A node of a server across hosts, checked from the node itself: its address is its
    own, the ports it must open are free there, the other nodes answer at the addresses
    they will use, the interface exists."""
    address = str(node.get("address") or "")
    out: Dict[str, Any] = {"address": address}
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.bind((address, 0))
        out["address_local"] = True
    except OSError as exc:
        out["address_local"] = False
        out["address_error"] = os.strerror(exc.errno or 0) if exc.errno else str(exc)
    finally:
        probe.close()
    ports: Dict[str, Any] = {}
    for port in node.get("ports") or []:
        state = _bind_free(address if out["address_local"] else "0.0.0.0", int(port))
        if not state["free"]:
            state["holder"] = _holder_of(int(port))
        ports[str(port)] = state
    out["ports"] = ports
    peers: Dict[str, Any] = {}
    for peer in node.get("peers") or []:
        target = (str(peer["address"]), int(peer["port"]))
        entry: Dict[str, Any] = {"address": target[0], "port": target[1]}
        try:
            socket.create_connection(target, timeout=3.0).close()
            entry["ok"] = True
        except OSError as exc:
            entry["ok"] = False
            entry["error"] = os.strerror(exc.errno) if exc.errno else (str(exc) or "timed out")
        peers[str(peer["name"])] = entry
    out["peers"] = peers
    iface = node.get("interface")
    if iface:
        out["interface"] = {"name": iface, "exists": os.path.isdir("/sys/class/net/" + iface)}
    return out


def _config_names(observed: Dict[str, Any]) -> List[str]:
    """The architectures and model types named by the target's and drafter's configs."""
    names: List[str] = []
    for key in ("target", "drafter"):
        config = (observed.get(key) or {}).get("config") or {}
        value = config.get("value") if isinstance(config, dict) else None
        if not isinstance(value, dict):
            continue
        archs = value.get("architectures")
        names += [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
        for cfg in (value, value.get("text_config")):
            if isinstance(cfg, dict) and isinstance(cfg.get("model_type"), str):
                names.append(cfg["model_type"])
    return sorted(set(names))[:64]


def _vllm_knows(package_dir: str, names: List[str]) -> Dict[str, bool]:
    """Which of `names` (architectures, model types) occur as string literals in the
    installed registry and config sources: what this vLLM can load."""
    files = (
        "model_executor/models/registry.py",
        "transformers_utils/config.py",
        "transformers_utils/configs/__init__.py",
    )
    text = ""
    for rel in files:
        try:
            with open(os.path.join(package_dir, rel), encoding="utf-8") as fh:
                text += fh.read()
        except OSError:
            continue
    return {n: ('"%s"' % n) in text or ("'%s'" % n) in text for n in names}


# -- launch / status / stop --------------------------------------------------------------


def _state_file(directory: str) -> Dict[str, Any]:
    found = _read_json(os.path.join(directory, "state.json"))
    return found.get("value") or {}


def _save_state(directory: str, state: Dict[str, Any]) -> None:
    replace_file(os.path.join(directory, "state.json"), json.dumps(state).encode("utf-8"))


def _program(name: str, launch: Dict[str, Any]) -> Dict[str, Any]:
    """The program's state under the supervisor its last launch used."""
    sup = backend(launch.get("supervisor"))
    out = sup.state(name, launch)
    out["supervisor"] = sup.name
    return out


def _profile_state(name: str, port: int) -> Dict[str, Any]:
    directory = run_dir(name)
    launch = _state_file(directory)
    out: Dict[str, Any] = {"exists": os.path.isdir(directory)}
    out["lock_held"] = lock_held(os.path.join(directory, "lock"))
    out["program"] = _program(name, launch)
    out["launch"] = launch
    out["health"] = health(port) if out["program"]["state"] == "RUNNING" else None
    return out


def op_launch(request: Dict[str, Any]) -> Dict[str, Any]:
    hold_on_hangup()
    name = str(request["name"])
    directory = run_dir(name)
    files = request["files"]
    launch_id = str(request.get("launch_id") or "")
    with FileLock(
        os.path.join(directory, "lock"), float(request.get("lock_wait", LAUNCH_LOCK_WAIT)), BUSY
    ):
        previous = _state_file(directory)
        status = _program(name, previous)
        if launch_id and previous.get("launch_id") == launch_id:
            # this very request launched already (its answer was lost with the connection)
            return dict(
                previous,
                state=status["state"],
                pid=status.get("pid") or previous.get("pid"),
                resumed=True,
            )
        if status["state"] in ACTIVE_STATES:
            if not request.get("restart"):
                # a server of this profile runs (another fleet serve started it): follow it
                return dict(
                    previous,
                    state=status["state"],
                    pid=status.get("pid") or previous.get("pid"),
                    attached=True,
                )
            backend(previous.get("supervisor")).stop(
                name, float(request.get("stop_timeout") or 120)
            )
        sup = backend(str(request.get("supervisor") or "supervisord"))
        sup.prepare(request)
        log = os.path.join(directory, LOG_NAME)
        if os.path.exists(log):
            os.replace(log, log + ".1")
        replace_file(
            os.path.join(directory, "launch.sh"), files["launch.sh"].encode("utf-8"), mode=0o700
        )
        replace_file(
            os.path.join(directory, "secrets.env"), files["secrets.env"].encode("utf-8"), mode=0o600
        )
        replace_file(log, b"", mode=0o600)
        started = time.time()
        sup.start(name, files)
        status = sup.state(name, {})
        st = os.stat(log)
        state = {
            "name": name,
            "launch_id": launch_id,
            "started_at": started,
            "pid": status.get("pid"),
            "log": log,
            "log_inode": st.st_ino,
            "port": request.get("port"),
            "supervisor": sup.name,
            "supervisor_source": getattr(sup, "tools", {}).get("source") or sup.name,
            # what the server runs (the rendered profile's sha256): fleet rollout compares it
            "fingerprint": request.get("fingerprint"),
        }
        if request.get("node"):
            state["node"] = request["node"]  # its part of a server across hosts
        _save_state(directory, state)
        return dict(state, state=status["state"])


def op_status(request: Dict[str, Any]) -> Dict[str, Any]:
    names = request.get("names")
    root = run_root()
    if not names:
        try:
            # only fleet's own run directories: a stray one (a name fleet serve refuses)
            # is not a profile and must not fail the whole status
            names = sorted(
                n
                for n in os.listdir(root)
                if profile_name_ok(n) and os.path.isdir(os.path.join(root, n))
            )
        except OSError:
            names = []
    profiles: Dict[str, Any] = {}
    for name in names:
        directory = run_dir(str(name))
        launch = _state_file(directory)
        program = _program(str(name), launch)
        log = os.path.join(directory, LOG_NAME)
        entry: Dict[str, Any] = {"program": program, "launch": launch, "now": time.time()}
        try:
            st = os.stat(log)
            entry["log_size"] = st.st_size
            if request.get("tail", True):
                with open(log, "rb") as fh:
                    fh.seek(max(0, st.st_size - LOG_TAIL_BYTES))
                    entry["log_tail"] = base64.b64encode(fh.read()).decode("ascii")
        except OSError:
            entry["log_size"] = None
        port = launch.get("port")
        if program["state"] == "RUNNING" and isinstance(port, int):
            entry["health"] = health(port)
            if entry["health"] == 200 and request.get("metrics"):
                entry["metrics"] = metrics(port)
        profiles[str(name)] = entry
    return {"profiles": profiles}


def op_stop(request: Dict[str, Any]) -> Dict[str, Any]:
    hold_on_hangup()
    name = str(request["name"])
    directory = run_dir(name)
    launch = _state_file(directory)
    before = _program(name, launch)
    node = launch.get("node")  # its part of a server across hosts (rank, role, group)
    if before["state"] not in ACTIVE_STATES:
        return {"was_running": False, "state": before["state"], "gpus": part_gpus(), "node": node}
    with FileLock(os.path.join(directory, "lock"), STOP_LOCK_WAIT, BUSY):
        started = time.monotonic()
        sup = backend(launch.get("supervisor"))
        launch["stopped_at"] = time.time()
        _save_state(directory, launch)
        text = sup.stop(name, float(request.get("timeout") or 300))
        after = _program(name, launch)
        return {
            "was_running": True,
            "pid": before.get("pid"),
            "state": after["state"],
            "stopped_in_s": round(time.monotonic() - started, 3),
            "supervisorctl": text,
            "gpus": part_gpus(),
            "node": node,
        }


def op_ray_nodes(request: Dict[str, Any]) -> Dict[str, Any]:
    """``ray status --address A``: the active nodes and GPUs of the Ray cluster."""
    ray = os.path.expanduser(str(request["ray"]))
    found = run_captured([ray, "status", "--address", str(request["address"])], 60.0)
    if found is None:
        return {"nodes": 0, "output": "ray status did not answer (or %s is missing)" % ray}
    _code, out, err = found
    text = out.decode("utf-8", "replace")
    nodes = 0
    gpus = None
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in ("Active:", "Pending:", "Recent failures:"):
            section = stripped
            continue
        if section == "Active:" and " node_" in " " + stripped:
            nodes += 1
        if stripped.endswith(" GPU") and "/" in stripped:
            try:
                gpus = float(stripped.split("/", 1)[1].split()[0])
            except ValueError:
                pass
    tail = (text + err.decode("utf-8", "replace"))[-500:]
    return {"nodes": nodes, "gpus": gpus, "output": tail}


OPS = {
    "preflight": op_preflight,
    "launch": op_launch,
    "status": op_status,
    "stop": op_stop,
    "ray-nodes": op_ray_nodes,
}

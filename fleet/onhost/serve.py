# fleet serve helper: runs ON THE HOST in a bundle (see _common.py), one round trip per op.
#
# Operations (request["op"]):
#   preflight  observations for the local preflight rules: the host's home, the installed
#              vLLM and what it says about EAGLE-3 (target class, allowlist, drafter
#              architectures and config types it knows), both config.json files and the
#              weight files next to them, GPUs and their free memory (nvidia-smi), the port
#              (a plain bind(): vLLM binds before it listens), disk, the profile's server
#              (supervisor state, /health) and whether another fleet serve holds its lock.
#   launch     under the profile's lock: refuse a running server (unless "restart"),
#              rotate the log, write launch.sh, secrets.env (0600) and the supervisor
#              program atomically, start fleet's own supervisord if it does not run
#              (installing the supervisor wheel fleet pushed into ~/.fleet/supervisor/venv
#              when the host has no supervisord), then start the program.
#   status     per profile: supervisor state, pid, uptime, the log's size and its last
#              bytes (the local phase tracker reads them), /health.
#   stop       through the supervisor (TERM to the process group, KILL after the grace
#              period); idempotent; the GPU memory nvidia-smi reports afterwards.
# Secrets arrive in the request (stdin), are written to a 0600 file and never printed.
import base64
import errno
import fcntl
import io
import json
import os
import socket
import subprocess
import sys
import time
import zipfile
from typing import Any, Dict, List, Optional, Tuple

from fleet.onhost._common import Refused, find_vllm, hold_on_hangup, vllm_version
from fleet.onhost.probes import disk_usage, executable_file, part_gpus, which
from fleet.onhost.vllm_tree import allowlists, model_classes

RUN_ROOT = os.path.join(".fleet", "run")
SUP_ROOT = os.path.join(".fleet", "supervisor")
LOG_TAIL_BYTES = 65536
CONFIG_MAX = 4 * 1024 * 1024
SUPERVISOR_WAIT = 20.0


def _home() -> str:
    return os.path.realpath(os.path.expanduser("~"))


def _run_dir(name: str) -> str:
    if not name or "/" in name or name.startswith(".") or len(name) > 64:
        raise Refused("bad profile name " + repr(name), "bad-request")
    return os.path.join(_home(), RUN_ROOT, name)


def _sup_dir() -> str:
    return os.path.join(_home(), SUP_ROOT)


def _write(path: str, data: bytes, mode: int) -> None:
    """A complete file at `path` with `mode` from its first byte (temp + fsync + rename)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = os.path.join(directory, ".%s.fleet-tmp-%d" % (os.path.basename(path), os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


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


def _health(port: int, timeout: float = 2.0) -> Optional[int]:
    """The HTTP status of GET /health on this host, or None (refused, no answer)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _metrics(port: int, timeout: float = 5.0, limit: int = 512 * 1024) -> Optional[str]:
    """The text of GET /metrics on this host (Prometheus exposition), or None."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        if response.status != 200:
            return None
        return response.read(limit).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _lock_held(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def op_preflight(request: Dict[str, Any]) -> Dict[str, Any]:
    profile = request["profile"]
    out: Dict[str, Any] = {"home": _home(), "python": sys.executable}
    package_dir = find_vllm()
    out["vllm"] = {"path": package_dir}
    if package_dir:
        version, _source = vllm_version(package_dir)
        out["vllm"]["version"] = version
        out["vllm"]["models"] = model_classes(package_dir)
        out["vllm"]["allowlist"] = allowlists(package_dir)
    out["target"] = _model_dir(str(profile["model"]))
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
    out["server"] = _profile_state(str(profile["name"]), int(profile["port"]))
    out["supervisor"] = _supervisor_tools()
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


# -- the supervisor ----------------------------------------------------------------------


def _supervisor_tools() -> Dict[str, Any]:
    """How to run supervisord/supervisorctl here: the host's own (beside the vLLM
    environment's python, or on PATH), else fleet's own virtualenv, else none."""
    for daemon in (
        os.path.join(os.path.dirname(sys.executable), "supervisord"),
        which("supervisord"),
    ):
        if daemon and executable_file(daemon):
            ctl = os.path.join(os.path.dirname(daemon), "supervisorctl")
            if executable_file(ctl):
                return {"source": "host", "supervisord": [daemon], "supervisorctl": [ctl]}
    venv_python = os.path.join(_sup_dir(), "venv", "bin", "python")
    if _has_supervisor(venv_python):
        return {
            "source": "fleet",
            "supervisord": [venv_python, "-m", "supervisor.supervisord"],
            "supervisorctl": [venv_python, "-m", "supervisor.supervisorctl"],
        }
    return {"source": None}


def _has_supervisor(python: str) -> bool:
    if not os.path.isfile(python):
        return False
    proc = subprocess.run(
        [python, "-c", "import supervisor.supervisord"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    return proc.returncode == 0


def _install_supervisor(wheel_b64: str, wheel_name: str) -> Dict[str, Any]:
    """fleet's own supervisor: a virtualenv under ~/.fleet/supervisor with the wheel fleet
    pushed (pure Python, no dependencies: nothing is downloaded on the host)."""
    venv_dir = os.path.join(_sup_dir(), "venv")
    python = os.path.join(venv_dir, "bin", "python")
    if not os.path.isfile(python):
        proc = subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", venv_dir],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise Refused(
                "cannot create a virtualenv for supervisor: "
                + proc.stderr.decode("utf-8", "replace").strip()[-300:],
                "supervisor-failed",
            )
    purelib = (
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        .stdout.decode()
        .strip()
    )
    if not purelib:
        raise Refused("cannot find the supervisor virtualenv's site-packages", "supervisor-failed")
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(wheel_b64))) as wheel:
        for member in wheel.namelist():
            top = member.split("/", 1)[0]
            if ".." in member.split("/") or member.startswith("/"):
                continue
            if top == "supervisor" or top.endswith(".dist-info"):
                wheel.extract(member, purelib)
    if not _has_supervisor(python):
        raise Refused("supervisor did not install from " + wheel_name, "supervisor-failed")
    return _supervisor_tools()


def _ctl(tools: Dict[str, Any], *args: str, timeout: float = 120.0) -> Any:
    conf = os.path.join(_sup_dir(), "supervisord.conf")
    return subprocess.run(
        [*list(tools["supervisorctl"]), "-c", conf, *list(args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
    )


def _supervisord_running(tools: Dict[str, Any]) -> bool:
    if not os.path.exists(os.path.join(_sup_dir(), "supervisor.sock")):
        return False
    return _ctl(tools, "pid", timeout=30).returncode == 0


def _ensure_supervisord(tools: Dict[str, Any], conf_text: str) -> None:
    sup = _sup_dir()
    os.makedirs(os.path.join(sup, "conf.d"), mode=0o700, exist_ok=True)
    os.makedirs(os.path.join(sup, "childlogs"), mode=0o700, exist_ok=True)
    conf = os.path.join(sup, "supervisord.conf")
    changed = True
    try:
        with open(conf, encoding="utf-8") as fh:
            changed = fh.read() != conf_text
    except OSError:
        pass
    if changed:
        _write(conf, conf_text.encode("utf-8"), 0o600)
    if _supervisord_running(tools):
        return
    # supervisord daemonizes (detached from this SSH session, its streams on /dev/null)
    proc = subprocess.run(
        [*list(tools["supervisord"]), "-c", conf],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=60,
        cwd=_home(),
    )
    deadline = time.monotonic() + SUPERVISOR_WAIT
    while time.monotonic() < deadline:
        if _supervisord_running(tools):
            return
        time.sleep(0.1)
    why = proc.stderr.decode("utf-8", "replace").strip()[-300:]
    why = why or _tail(os.path.join(sup, "supervisord.log"), 300)
    raise Refused("supervisord did not start: " + why, "supervisor-failed")


def _tail(path: str, n: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _program_status(tools: Dict[str, Any], name: str) -> Dict[str, Any]:
    """supervisorctl's view of the program: state, pid, its description."""
    if tools.get("source") is None or not _supervisord_running(tools):
        return {"state": "STOPPED", "supervisord": False}
    proc = _ctl(tools, "status", name, timeout=30)
    line = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    text = line[0] if line else ""
    fields = text.split(None, 2)
    state = fields[1] if len(fields) > 1 and fields[0] == name else "UNKNOWN"
    if "no such process" in text.lower() or "ERROR (no such" in text:
        state = "ABSENT"
    out: Dict[str, Any] = {"state": state, "supervisord": True, "description": text[:300]}
    if state == "RUNNING" and "pid " in text:
        try:
            out["pid"] = int(text.split("pid ", 1)[1].split(",", 1)[0])
        except ValueError:
            pass
    return out


# -- launch / status / stop --------------------------------------------------------------


class _Lock:
    """The profile's lock: one fleet serve (or stop) of a profile on a host at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> "_Lock":
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = -1
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise Refused(
                    "another fleet serve or stop of this profile is running on this host",
                    "host-busy",
                ) from None
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def _state_file(run_dir: str) -> Dict[str, Any]:
    found = _read_json(os.path.join(run_dir, "state.json"))
    return found.get("value") or {}


def _profile_state(name: str, port: int) -> Dict[str, Any]:
    run_dir = _run_dir(name)
    tools = _supervisor_tools()
    out: Dict[str, Any] = {"exists": os.path.isdir(run_dir)}
    out["lock_held"] = _lock_held(os.path.join(run_dir, "lock"))
    out["program"] = _program_status(tools, name)
    out["launch"] = _state_file(run_dir)
    out["health"] = _health(port) if out["program"]["state"] == "RUNNING" else None
    return out


def op_launch(request: Dict[str, Any]) -> Dict[str, Any]:
    hold_on_hangup()
    name = str(request["name"])
    run_dir = _run_dir(name)
    files = request["files"]
    with _Lock(os.path.join(run_dir, "lock")):
        tools = _supervisor_tools()
        if tools.get("source") is None:
            wheel = request.get("supervisor_wheel")
            if not wheel:
                raise Refused(
                    "the host has no supervisord and no wheel was sent", "supervisor-failed"
                )
            tools = _install_supervisor(wheel, str(request.get("supervisor_wheel_name")))
        if _supervisord_running(tools):
            status = _program_status(tools, name)
            if status["state"] in ("RUNNING", "STARTING", "BACKOFF", "STOPPING"):
                if not request.get("restart"):
                    raise Refused(
                        "a server for %s already runs here (pid %s)" % (name, status.get("pid")),
                        "already-running",
                    )
                _ctl(tools, "stop", name, timeout=float(request.get("stop_timeout") or 120))
        log = os.path.join(run_dir, "vllm.log")
        if os.path.exists(log):
            os.replace(log, log + ".1")
        _write(os.path.join(run_dir, "launch.sh"), files["launch.sh"].encode("utf-8"), 0o700)
        _write(os.path.join(run_dir, "secrets.env"), files["secrets.env"].encode("utf-8"), 0o600)
        _write(log, b"", 0o600)
        program = os.path.join(_sup_dir(), "conf.d", name + ".conf")
        _ensure_supervisord(tools, files["supervisord.conf"])
        _write(program, files["program.conf"].encode("utf-8"), 0o600)
        for step in (["reread"], ["update", name]):
            proc = _ctl(tools, *step)
            if proc.returncode != 0:
                raise Refused(
                    "supervisorctl %s: %s" % (" ".join(step), _text(proc)), "supervisor-failed"
                )
        started = time.time()
        proc = _ctl(tools, "start", name)
        status = _program_status(tools, name)
        if proc.returncode != 0 and status["state"] not in ("RUNNING", "EXITED"):
            raise Refused("supervisorctl start %s: %s" % (name, _text(proc)), "supervisor-failed")
        st = os.stat(log)
        state = {
            "name": name,
            "started_at": started,
            "pid": status.get("pid"),
            "log": log,
            "log_inode": st.st_ino,
            "port": request.get("port"),
            "supervisor": tools["source"],
        }
        _write(os.path.join(run_dir, "state.json"), json.dumps(state).encode("utf-8"), 0o600)
        return dict(state, state=status["state"], supervisor_source=tools["source"])


def _text(proc: Any) -> str:
    return (proc.stdout + proc.stderr).decode("utf-8", "replace").strip()[-300:]


def op_status(request: Dict[str, Any]) -> Dict[str, Any]:
    names = request.get("names")
    root = os.path.join(_home(), RUN_ROOT)
    if not names:
        try:
            names = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))
        except OSError:
            names = []
    tools = _supervisor_tools()
    profiles: Dict[str, Any] = {}
    for name in names:
        run_dir = _run_dir(str(name))
        launch = _state_file(run_dir)
        program = _program_status(tools, str(name))
        log = os.path.join(run_dir, "vllm.log")
        entry: Dict[str, Any] = {"program": program, "launch": launch, "now": time.time()}
        try:
            st = os.stat(log)
            entry["log_size"] = st.st_size
            with open(log, "rb") as fh:
                fh.seek(max(0, st.st_size - LOG_TAIL_BYTES))
                entry["log_tail"] = base64.b64encode(fh.read()).decode("ascii")
        except OSError:
            entry["log_size"] = None
        port = launch.get("port")
        if program["state"] == "RUNNING" and isinstance(port, int):
            entry["health"] = _health(port)
            if entry["health"] == 200 and request.get("metrics"):
                entry["metrics"] = _metrics(port)
        profiles[str(name)] = entry
    return {"profiles": profiles}


def op_stop(request: Dict[str, Any]) -> Dict[str, Any]:
    hold_on_hangup()
    name = str(request["name"])
    run_dir = _run_dir(name)
    tools = _supervisor_tools()
    before = _program_status(tools, name)
    if before["state"] not in ("RUNNING", "STARTING", "BACKOFF", "STOPPING"):
        return {"was_running": False, "state": before["state"], "gpus": part_gpus()}
    with _Lock(os.path.join(run_dir, "lock")):
        started = time.monotonic()
        proc = _ctl(tools, "stop", name, timeout=float(request.get("timeout") or 300))
        after = _program_status(tools, name)
        gpus = part_gpus()
        return {
            "was_running": True,
            "pid": before.get("pid"),
            "state": after["state"],
            "stopped_in_s": round(time.monotonic() - started, 3),
            "supervisorctl": _text(proc),
            "gpus": gpus,
        }


OPS = {"preflight": op_preflight, "launch": op_launch, "status": op_status, "stop": op_stop}

# The supervisors fleet serve can run vLLM under, ON THE HOST (stdlib only).
#
# One small interface, two backends (the control side chooses one from what `describe`
# reports; fleet/serving/supervisor.py):
#   describe()           what this host offers: is the backend usable here, and why not
#   prepare(request)     make it ready (supervisord: install fleet's own from the pushed
#                        wheel when the host has none; write its configuration; start it)
#   start(name, files)   write the program's file (a supervisord program, a systemd unit)
#                        and start it
#   state(name, launch)  the program's state in supervisord's words: RUNNING, STARTING,
#                        BACKOFF, STOPPING, STOPPED, EXITED, FATAL, ABSENT, UNKNOWN; its pid
#   stop(name, timeout)  TERM to the whole process group, KILL after the grace period
#
# supervisord: fleet's own instance per host user (~/.fleet/supervisor), outliving every
# SSH session. systemd: a system unit /etc/systemd/system/fleet-<profile>.service, for a
# root login on a host booted with systemd (PID 1); vLLM's log is appended to the run
# directory's vllm.log by systemd itself.
import base64
import io
import os
import subprocess
import sys
import time
import zipfile
from typing import Any, Dict, List, Optional

from fleet.onhost._common import Refused
from fleet.onhost.files import replace_file
from fleet.onhost.layout import home, supervisor_dir
from fleet.onhost.probes import executable_file, which

SUPERVISOR_WAIT = 20.0
# A program in these states holds (or is about to hold) its port and GPUs: the one
# definition, read here by serve's launch and status and by the control side's serve.
ACTIVE_STATES = ("RUNNING", "STARTING", "BACKOFF", "STOPPING")
SYSTEMD_UNIT_DIR = "/etc/systemd/system"


def _text(proc: Any) -> str:
    return (proc.stdout + proc.stderr).decode("utf-8", "replace").strip()[-300:]


def _run(argv: List[str], timeout: float) -> Any:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)


def _tail(path: str, n: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


# -- supervisord --------------------------------------------------------------------------


class Supervisord:
    name = "supervisord"

    def __init__(self) -> None:
        self.tools = self._tools()

    @staticmethod
    def _tools() -> Dict[str, Any]:
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
        venv_python = os.path.join(supervisor_dir(), "venv", "bin", "python")
        if _imports_supervisor(venv_python):
            return {
                "source": "fleet",
                "supervisord": [venv_python, "-m", "supervisor.supervisord"],
                "supervisorctl": [venv_python, "-m", "supervisor.supervisorctl"],
            }
        return {"source": None}

    def describe(self) -> Dict[str, Any]:
        # always usable: fleet installs its own from the wheel it pushes
        return {"usable": True, "source": self.tools.get("source")}

    def ctl(self, *args: str, timeout: float = 120.0) -> Any:
        conf = os.path.join(supervisor_dir(), "supervisord.conf")
        return _run([*list(self.tools["supervisorctl"]), "-c", conf, *list(args)], timeout)

    def daemon_running(self) -> bool:
        if self.tools.get("source") is None:
            return False
        if not os.path.exists(os.path.join(supervisor_dir(), "supervisor.sock")):
            return False
        return self.ctl("pid", timeout=30).returncode == 0

    def daemon_pid(self) -> Optional[int]:
        proc = self.ctl("pid", timeout=30) if self.daemon_running() else None
        try:
            return int(proc.stdout.decode().strip()) if proc is not None else None
        except ValueError:
            return None

    def prepare(self, request: Dict[str, Any]) -> None:
        if self.tools.get("source") is None:
            wheel = request.get("supervisor_wheel")
            if not wheel:
                raise Refused(
                    "the host has no supervisord and no wheel was sent", "supervisor-failed"
                )
            _install_supervisor(str(wheel), str(request.get("supervisor_wheel_name")))
            self.tools = self._tools()
        self._ensure_daemon(str(request["files"]["supervisord.conf"]))

    def _ensure_daemon(self, conf_text: str) -> None:
        sup = supervisor_dir()
        os.makedirs(os.path.join(sup, "conf.d"), mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(sup, "childlogs"), mode=0o700, exist_ok=True)
        conf = os.path.join(sup, "supervisord.conf")
        try:
            with open(conf, encoding="utf-8") as fh:
                changed = fh.read() != conf_text
        except OSError:
            changed = True
        if changed:
            replace_file(conf, conf_text.encode("utf-8"), mode=0o600)
        if self.daemon_running():
            return
        # supervisord daemonizes (detached from this SSH session, its streams on /dev/null)
        proc = subprocess.run(
            [*list(self.tools["supervisord"]), "-c", conf],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
            cwd=home(),
        )
        deadline = time.monotonic() + SUPERVISOR_WAIT
        while time.monotonic() < deadline:
            if self.daemon_running():
                return
            time.sleep(0.1)
        why = proc.stderr.decode("utf-8", "replace").strip()[-300:]
        why = why or _tail(os.path.join(sup, "supervisord.log"), 300)
        raise Refused("supervisord did not start: " + why, "supervisor-failed")

    def start(self, name: str, files: Dict[str, str]) -> None:
        program = os.path.join(supervisor_dir(), "conf.d", name + ".conf")
        replace_file(program, files["program.conf"].encode("utf-8"), mode=0o600)
        for step in (["reread"], ["update", name]):
            proc = self.ctl(*step)
            if proc.returncode != 0:
                raise Refused(
                    "supervisorctl %s: %s" % (" ".join(step), _text(proc)), "supervisor-failed"
                )
        proc = self.ctl("start", name)
        if proc.returncode != 0 and self.state(name)["state"] not in ("RUNNING", "EXITED"):
            raise Refused("supervisorctl start %s: %s" % (name, _text(proc)), "supervisor-failed")

    def state(self, name: str, launch: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """supervisorctl's view of the program: state, pid, its description."""
        if not self.daemon_running():
            return {"state": "STOPPED", "supervisord": False, "daemon": False}
        proc = self.ctl("status", name, timeout=30)
        lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
        text = lines[0] if lines else ""
        fields = text.split(None, 2)
        state = fields[1] if len(fields) > 1 and fields[0] == name else "UNKNOWN"
        if "no such process" in text.lower() or "ERROR (no such" in text:
            state = "ABSENT"
        out: Dict[str, Any] = {
            "state": state,
            "supervisord": True,
            "daemon": True,
            "description": text[:300],
        }
        if state == "RUNNING" and "pid " in text:
            try:
                out["pid"] = int(text.split("pid ", 1)[1].split(",", 1)[0])
            except ValueError:
                pass
        return out

    def stop(self, name: str, timeout: float) -> str:
        return _text(self.ctl("stop", name, timeout=timeout))


def _imports_supervisor(python: str) -> bool:
    if not os.path.isfile(python):
        return False
    return _run([python, "-c", "import supervisor.supervisord"], 30).returncode == 0


def _install_supervisor(wheel_b64: str, wheel_name: str) -> None:
    """fleet's own supervisor: a virtualenv under ~/.fleet/supervisor with the wheel fleet
    pushed (pure Python, no dependencies: nothing is downloaded on the host)."""
    venv_dir = os.path.join(supervisor_dir(), "venv")
    python = os.path.join(venv_dir, "bin", "python")
    if not os.path.isfile(python):
        proc = _run([sys.executable, "-m", "venv", "--without-pip", venv_dir], 120)
        if proc.returncode != 0:
            raise Refused(
                "cannot create a virtualenv for supervisor: "
                + proc.stderr.decode("utf-8", "replace").strip()[-300:],
                "supervisor-failed",
            )
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = _run([python, "-c", code], 60).stdout.decode().strip()
    if not purelib:
        raise Refused("cannot find the supervisor virtualenv's site-packages", "supervisor-failed")
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(wheel_b64))) as wheel:
        for member in wheel.namelist():
            top = member.split("/", 1)[0]
            if ".." in member.split("/") or member.startswith("/"):
                continue
            if top == "supervisor" or top.endswith(".dist-info"):
                wheel.extract(member, purelib)
    if not _imports_supervisor(python):
        raise Refused("supervisor did not install from " + wheel_name, "supervisor-failed")


# -- systemd ------------------------------------------------------------------------------

_SHOW = (
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "Result",
    "ExecMainStatus",
    "ExecMainCode",
    "ExecMainStartTimestampMonotonic",
)


def unit_name(name: str) -> str:
    return "fleet-%s.service" % name


class Systemd:
    name = "systemd"

    def __init__(self) -> None:
        self.systemctl = which("systemctl")

    def describe(self) -> Dict[str, Any]:
        """Usable when PID 1 is systemd, systemctl answers, and fleet logs in as root
        (fleet writes system units; user units would need lingering)."""
        out: Dict[str, Any] = {"usable": False, "systemctl": self.systemctl}
        try:
            with open("/proc/1/comm") as fh:
                out["pid1"] = fh.read().strip()
        except OSError:
            out["pid1"] = None
        if out["pid1"] != "systemd" or not os.path.isdir("/run/systemd/system"):
            out["why"] = "the host was not booted with systemd (PID 1 is %s)" % out["pid1"]
            return out
        if not self.systemctl:
            out["why"] = "no systemctl on PATH"
            return out
        if os.geteuid() != 0:
            out["why"] = "fleet writes system units and logs in as a user other than root"
            return out
        proc = _run([self.systemctl, "is-system-running"], 30)
        out["system"] = proc.stdout.decode("utf-8", "replace").strip()
        if out["system"] not in ("running", "degraded", "starting"):
            out["why"] = "systemd is %s" % (out["system"] or "not answering")
            return out
        out["usable"] = True
        return out

    def _ctl(self, *args: str, timeout: float = 120.0) -> Any:
        if not self.systemctl:
            raise Refused("no systemctl on this host", "supervisor-failed")
        return _run([self.systemctl, *list(args)], timeout)

    def prepare(self, request: Dict[str, Any]) -> None:
        info = self.describe()
        if not info["usable"]:
            raise Refused("systemd cannot run the server here: " + info["why"], "supervisor-failed")

    def start(self, name: str, files: Dict[str, str]) -> None:
        unit = unit_name(name)
        path = os.path.join(SYSTEMD_UNIT_DIR, unit)
        replace_file(path, files["unit"].encode("utf-8"), mode=0o644)
        for step in (["daemon-reload"], ["reset-failed", unit], ["start", "--no-block", unit]):
            proc = self._ctl(*step)
            if proc.returncode != 0 and step[0] != "reset-failed":
                raise Refused(
                    "systemctl %s: %s" % (" ".join(step), _text(proc)), "supervisor-failed"
                )
        deadline = time.monotonic() + SUPERVISOR_WAIT
        while time.monotonic() < deadline:
            if self.state(name)["state"] != "STARTING":
                return
            time.sleep(0.1)

    def show(self, name: str) -> Dict[str, str]:
        proc = self._ctl("show", unit_name(name), *["--property=" + p for p in _SHOW], timeout=30)
        out: Dict[str, str] = {}
        for line in proc.stdout.decode("utf-8", "replace").splitlines():
            key, _sep, value = line.partition("=")
            out[key] = value
        return out

    def state(self, name: str, launch: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """systemctl's view of the unit, in supervisord's words. An inactive unit that ran
        is EXITED (vLLM exits 0 when its engine dies) unless fleet stop stopped it."""
        if not self.systemctl:
            return {"state": "UNKNOWN", "daemon": False}
        props = self.show(name)
        active = props.get("ActiveState", "")
        sub = props.get("SubState", "")
        description = "%s %s/%s result=%s status=%s" % (
            unit_name(name),
            active,
            sub,
            props.get("Result"),
            props.get("ExecMainStatus"),
        )
        out: Dict[str, Any] = {"daemon": True, "description": description}
        ran = props.get("ExecMainStartTimestampMonotonic", "0") not in ("", "0")
        stopped = bool((launch or {}).get("stopped_at"))
        if props.get("LoadState") == "not-found":
            out["state"] = "ABSENT"
        elif active == "active":
            out["state"] = "RUNNING" if sub in ("running", "exited") else "STARTING"
        elif active in ("activating", "reloading"):
            out["state"] = "STARTING"
        elif active == "deactivating":
            out["state"] = "STOPPING"
        elif active in ("failed", "inactive") and ran and not stopped:
            out["state"] = "EXITED"
        else:
            out["state"] = "STOPPED"
        if out["state"] == "RUNNING":
            try:
                out["pid"] = int(props.get("MainPID") or 0) or None
            except ValueError:
                pass
        if props.get("ExecMainStatus") not in (None, ""):
            out["exit_status"] = props.get("ExecMainStatus")
        return out

    def stop(self, name: str, timeout: float) -> str:
        return _text(self._ctl("stop", unit_name(name), timeout=timeout))


BACKENDS: Dict[str, Any] = {"supervisord": Supervisord, "systemd": Systemd}


def backend(name: Optional[str]) -> Any:
    """The backend named ``name`` (a launch recorded without one ran under supervisord)."""
    cls = BACKENDS.get(name or "supervisord")
    if cls is None:
        raise Refused("unknown supervisor %r" % name, "bad-request")
    return cls()


def describe_all() -> Dict[str, Any]:
    return {name: cls().describe() for name, cls in BACKENDS.items()}

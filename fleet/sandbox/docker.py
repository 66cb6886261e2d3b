"""Docker backend: every rehearsal host is a docker-sshd container built from ``tests/docker``.

The images hold a host as fleet meets a real GPU host: root logs in over OpenSSH,
``/root/ml-env`` is a venv of the system Python whose site-packages hold the real vLLM files
of one version, ``nvidia-smi`` is the stand-in, and Debian's ``supervisord`` runs (one
variant has no supervisor at all). They are built ``FROM`` the local base image
``fleet-sandbox-base:bookworm`` that ``scripts/docker-engine.sh`` makes with debootstrap:
nothing is pulled.

Images: ``fleet-sandbox-host:vllm-<version>`` (and ``...-nosupervisor``), each labelled with
the sha256 of everything it was built from (the staged context, the target, the base image
id). A build runs only when that label differs, so images are cached between runs and
rebuilt when the Dockerfile, a staged input, the base image or the version changes.

Per sandbox, fleet creates one bridge network; per host, one container on it with port 22
published on ``127.0.0.1:<port>`` only (and the host's ``vllm_port`` on ``127.0.0.1`` at the
same number, so a served endpoint is reachable from this machine), and copies in a fresh
host key, the sandbox's client key and ``host.json`` before the first start. The engine
``scripts/docker-engine.sh`` starts runs without Docker's userland proxy, so a published
port nothing listens on refuses a connection as a real host's does (with the proxy, it
accepts and closes). The knobs ``Sandbox.set_sim``/``set_gpu_state``/``gpu_state`` and
``cut_sessions`` work through ``docker exec`` (files written atomically in the container;
the per-connection sshd processes killed, never the listener). Containers and the network are found
again by the ids recorded under the sandbox directory (never by name or label), and
``down`` removes them.

Selected by ``fleet sandbox up --backend docker`` or ``FLEET_SANDBOX_BACKEND=docker`` (the
pytest fixtures honour the latter); needs a running Docker engine (``scripts/docker-engine.sh``
starts one) and a checkout (the Dockerfile lives in ``tests/docker``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleet.errors import OperationFailed, UsageError
from fleet.localfiles import locked
from fleet.sandbox import model
from fleet.sandbox.local import free_port, generate_keypair, write_text_atomic
from fleet.transport import shell

IMAGE = "fleet-sandbox-host"
BASE_IMAGE = "fleet-sandbox-base:bookworm"
INPUTS_LABEL = "org.fleet.inputs"
SANDBOX_LABEL = "org.fleet.sandbox"  # descriptive only: ids are what fleet acts on
NETWORK_PREFIX = "fleet-sandbox-"
ENGINE_SCRIPT = "scripts/docker-engine.sh"
HOME = "/root"
PYTHON = f"{HOME}/{model.ENV_DIR}/bin/python"
START_TIMEOUT = 30.0
STOP_SECONDS = 5
TARGET_WITH_SUPERVISOR = "host"
TARGET_WITHOUT_SUPERVISOR = "host-without-supervisor"
TARGET_SYSTEMD = "host-systemd"
# A container that boots systemd as PID 1: every capability this machine grants (its
# bounding set lacks CAP_SYS_RESOURCE, so --privileged cannot start), the host's cgroup
# tree (cgroup v1 here), a tmpfs /run, and systemd's own stop signal.
SYSTEMD_RUN_ARGS = (
    "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--cgroupns", "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run", "--tmpfs", "/run/lock", "--stop-signal", "SIGRTMIN+3",
)  # fmt: skip
CONTEXT_FILES = ("Dockerfile", "sshd_config", "init.sh")

# Run inside a container (docker exec, constant text; the path is "$1"): stdin to a
# temporary file beside the target, then a rename.
_WRITE_FILE = (
    'set -e; d=$(dirname -- "$1"); mkdir -p -- "$d"; t="$1.tmp.$$"; '
    'trap \'rm -f -- "$t"\' EXIT; cat > "$t"; mv -f -- "$t" "$1"; trap - EXIT'
)
# Run inside a container: SIGKILL every sshd process below the listener (its pid file),
# never the listener; prints the pids it signalled.
_CUT_SESSIONS = (
    "set -e; l=$(cat /run/sshd.pid); "
    'ps -e -o pid= -o ppid= -o comm= | awk -v l="$l" \''
    "{ parent[$1] = $2; comm[$1] = $3 } "
    'END { for (p in parent) { if (p == l || comm[p] != "sshd") continue; '
    'q = parent[p]; while (q != "" && q > 1) { if (q == l) { print p; break } '
    "q = parent[q] } } }' "
    '| while read -r p; do kill -KILL "$p" 2>/dev/null && echo "$p"; done; true'
)
# Images checked (or built) by this process: tag -> image id.
_READY: dict[str, str] = {}
_READY_LOCK = threading.Lock()
# Container id -> path of its json-file log (read directly when we may; else `docker logs`).
_LOG_PATHS: dict[str, str | None] = {}
# Hosts of one sandbox start in parallel threads: one of them creates the network.
_NETWORK_LOCK = threading.Lock()


def docker_dir() -> Path:
    """``tests/docker`` of this checkout (the Dockerfile and the files it copies)."""
    here = Path(__file__).resolve().parents[2] / "tests" / "docker"
    if not (here / "Dockerfile").is_file():
        raise UsageError(f"the docker backend needs a fleet checkout ({here}/Dockerfile not found)")
    return here


def _docker(
    *args: str, check: bool = True, timeout: float = 600.0
) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise OperationFailed("docker backend: the docker command is not installed") from None
    except subprocess.TimeoutExpired:
        raise OperationFailed(f"docker {args[0]}: no answer within {timeout:.0f}s") from None
    if check and proc.returncode != 0:
        raise OperationFailed(f"docker {args[0]}: {_last_line(proc)}")
    return proc


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if "DEPRECATED" not in line]
    return (lines or [proc.stdout.strip() or "no output"])[-1]


def engine_version() -> str | None:
    """The Docker engine's version, or None when no engine answers."""
    try:
        proc = _docker("version", "--format", "{{.Server.Version}}", check=False, timeout=20)
    except OperationFailed:
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and out else None


def image_id(ref: str) -> str | None:
    """The id (``sha256:...``) of a local image, or None if there is no such image."""
    proc = _docker("image", "inspect", "--format", "{{.Id}}", ref, check=False, timeout=30)
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and out else None


def image_tag(version: str, *, supervisor: bool = True, systemd: bool = False) -> str:
    if systemd:
        return f"{IMAGE}:vllm-{version}-systemd"
    return f"{IMAGE}:vllm-{version}" + ("" if supervisor else "-nosupervisor")


def stage_serve_files(overlay: Path, version: str) -> None:
    """Files copied onto ``/`` of every host image (the serve issue's merge point): the
    rehearsal vLLM as ``root/ml-env/bin/vllm`` (run by the image's ``/root/ml-env/bin/python``)
    and the checkpoints it serves under ``root/models/`` -- what a local host gets in its
    home (``fleet.sandbox.local.stage_rehearsal_files``). Everything under ``overlay`` is
    part of the image's input hash, so a change to the simulator rebuilds the images."""
    from fleet.sandbox.local import stage_rehearsal_files

    del version  # the same files for every version (the simulator reads the installed tree)
    overlay.mkdir(parents=True, exist_ok=True)
    stage_rehearsal_files(overlay, home=HOME, python=PYTHON)


def stage_context(context: Path, tree: Path, version: str | None = None) -> Path:
    """The docker build context of one vLLM version: vLLM files, nvidia-smi, sshd snippet."""
    from fleet.onhost.rehearsal import nvidia_smi

    src = docker_dir()
    if context.exists():
        shutil.rmtree(context)
    context.mkdir(parents=True)
    for name in CONTEXT_FILES:
        shutil.copy2(src / name, context / name)
    shutil.copy2(Path(nvidia_smi.__file__), context / "nvidia_smi.py")
    target = context / "vllm-tree"
    target.mkdir()
    for item in sorted(tree.iterdir()):
        if item.name == "vllm" or item.name.endswith(".dist-info"):
            shutil.copytree(item, target / item.name)
    stage_serve_files(context / "overlay", version or tree.name)
    return context


def context_digest(context: Path, *extra: str) -> str:
    """sha256 over every file of ``context`` (relative path, mode, bytes) and ``extra``."""
    digest = hashlib.sha256()
    for value in extra:
        digest.update(f"extra\0{value}\0".encode())
    for path in sorted(context.rglob("*")):
        rel = path.relative_to(context).as_posix()
        if path.is_symlink():
            digest.update(f"link\0{rel}\0{os.readlink(path)}\0".encode())
        elif path.is_file():
            mode = path.stat().st_mode & 0o777
            digest.update(f"file\0{rel}\0{mode:o}\0".encode())
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        elif path.is_dir():
            digest.update(f"dir\0{rel}\0".encode())
    return digest.hexdigest()


def ensure_image(
    version: str, tree: Path, *, supervisor: bool = True, systemd: bool = False
) -> str:
    """The id of the host image of ``version``, built first when its inputs changed."""
    from fleet.paths import cache_dir

    tag = image_tag(version, supervisor=supervisor, systemd=systemd)
    with _READY_LOCK:
        if tag in _READY:
            return _READY[tag]
    with locked(cache_dir() / "locks" / f"docker-image-{tag.replace(':', '-')}.lock"):
        base = image_id(BASE_IMAGE)
        if base is None:
            raise OperationFailed(
                f"docker backend: no base image {BASE_IMAGE} in this engine "
                f"(build it: {ENGINE_SCRIPT}, or scripts/bootstrap.sh --docker)"
            )
        target = TARGET_WITH_SUPERVISOR if supervisor else TARGET_WITHOUT_SUPERVISOR
        if systemd:
            target = TARGET_SYSTEMD
        with tempfile.TemporaryDirectory(prefix="fleet-docker-") as tmp:
            context = stage_context(Path(tmp) / "context", tree, version)
            digest = context_digest(
                context, f"version={version}", f"target={target}", f"base={base}"
            )
            old = image_id(tag)
            if old is None or _label(tag, INPUTS_LABEL) != digest:
                _docker(
                    "build",
                    "--quiet",
                    "--target",
                    target,
                    "--build-arg",
                    f"VLLM_VERSION={version}",
                    "--label",
                    f"{INPUTS_LABEL}={digest}",
                    "-t",
                    tag,
                    str(context),
                    timeout=1800,
                )
                new = image_id(tag)
                if old and new != old:  # the image it replaces, if nothing uses it
                    _docker("image", "rm", old, check=False, timeout=60)
        built = image_id(tag)
        if built is None:
            raise OperationFailed(f"docker build of {tag} left no image")
    with _READY_LOCK:
        _READY[tag] = built
    return built


def _label(ref: str, label: str) -> str:
    proc = _docker(
        "inspect",
        "--format",
        f'{{{{ index .Config.Labels "{label}" }}}}',
        ref,
        check=False,
        timeout=30,
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _read_id(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class DockerBackend:
    """Rehearsal hosts as docker-sshd containers, one per host, on one network per sandbox."""

    name = "docker"

    def __init__(self, root: Path, user: str) -> None:
        self.root = root
        self.user = user
        self.login_user = "root"  # the containers' sshd logs in root, whoever runs fleet

    # -- paths ----------------------------------------------------------------------------
    def host_dir(self, name: str) -> Path:
        return self.root / "hosts" / name

    @property
    def network_file(self) -> Path:
        return self.root / "hosts" / "network"

    def describe(self) -> str:
        version = engine_version()
        if version is None:
            raise OperationFailed(
                "docker backend selected but no Docker engine answers (start one: "
                f"{ENGINE_SCRIPT}; or unset FLEET_SANDBOX_BACKEND to use local sshd hosts)"
            )
        base = image_id(BASE_IMAGE)
        shown = _short(base) if base else "missing"
        return f"docker-sshd containers (Docker Engine {version}, base {BASE_IMAGE} {shown})"

    def plan_host(self, name: str, vllm: str, port: int) -> model.SandboxHost:
        return model.SandboxHost(
            name=name, vllm=vllm, address=model.ADDRESS, port=port, home=HOME, python=PYTHON
        )

    # -- building ---------------------------------------------------------------------------
    def prepare(
        self, host: model.SandboxHost, tree: Path, client_public_key: str, info: dict[str, Any]
    ) -> None:
        hdir = self.host_dir(host.name)
        hdir.mkdir(parents=True, exist_ok=True)
        supervisor = bool(info.get("supervisor", True))
        systemd = info.get("init") == "systemd"
        ensure_image(host.vllm, tree, supervisor=supervisor, systemd=systemd)
        tag = image_tag(host.vllm, supervisor=supervisor, systemd=systemd)
        write_text_atomic(hdir / "image", tag + "\n")
        write_text_atomic(hdir / "init", ("systemd" if systemd else "sshd") + "\n")
        generate_keypair(hdir / "ssh_host_ed25519_key", f"fleet-sandbox-host-{host.name}")
        write_text_atomic(hdir / "authorized_keys", client_public_key.strip() + "\n", mode=0o600)
        write_text_atomic(hdir / "host.json", json.dumps(info, indent=2) + "\n")

    def _image(self, host: model.SandboxHost) -> str:
        return _read_id(self.host_dir(host.name) / "image") or image_tag(host.vllm)

    def container(self, host: model.SandboxHost) -> str | None:
        """The id of ``host``'s container, as recorded when it was created."""
        return _read_id(self.host_dir(host.name) / "container")

    def network(self) -> str | None:
        """The id of this sandbox's network, as recorded when it was created."""
        return _read_id(self.network_file)

    def _ensure_network(self) -> str:
        with _NETWORK_LOCK:
            known = self.network()
            if known and _docker("network", "inspect", known, check=False).returncode == 0:
                return known
            name = f"{NETWORK_PREFIX}{secrets.token_hex(6)}"
            created = _docker(
                "network",
                "create",
                "--driver",
                "bridge",
                "--label",
                f"{SANDBOX_LABEL}={self.root}",
                name,
            ).stdout.strip()
            write_text_atomic(self.network_file, created + "\n")
            return created

    def _create(self, host: model.SandboxHost, port: int) -> str:
        hdir = self.host_dir(host.name)
        network = self._ensure_network()
        cidfile = hdir / "container"
        cidfile.unlink(missing_ok=True)
        # --cidfile: docker records the id itself the moment the container exists. The name
        # (the network's random suffix + the host) is for people reading `docker ps`.
        suffix = _network_name(network).removeprefix(NETWORK_PREFIX)
        init = ["--init"] if not self.boots_systemd(host) else list(SYSTEMD_RUN_ARGS)
        _docker(
            "create",
            *init,
            "--cidfile",
            str(cidfile),
            "--name",
            f"fleet-{suffix}-{host.name}",
            "--network",
            network,
            "--hostname",
            host.name,
            "-p",
            f"{host.address}:{port}:22",
            *_vllm_publish(host),
            "--label",
            f"{SANDBOX_LABEL}={self.root}",
            self._image(host),
        )
        cid = self.container(host)
        if cid is None:
            raise OperationFailed(f"{host.name}: docker create recorded no container id")
        self._copy_keys(host, cid)
        _docker("cp", str(hdir / "host.json"), f"{cid}:{HOME}/.fleet-sandbox/host.json")
        return cid

    def _copy_keys(self, host: model.SandboxHost, cid: str) -> None:
        hdir = self.host_dir(host.name)
        _docker("cp", str(hdir / "ssh_host_ed25519_key"), f"{cid}:/etc/ssh/ssh_host_ed25519_key")
        _docker(
            "cp", str(hdir / "ssh_host_ed25519_key.pub"), f"{cid}:/etc/ssh/ssh_host_ed25519_key.pub"
        )
        _docker("cp", str(hdir / "authorized_keys"), f"{cid}:{HOME}/.ssh/authorized_keys")

    def public_key(self, host: model.SandboxHost) -> str:
        return (self.host_dir(host.name) / "ssh_host_ed25519_key.pub").read_text().strip()

    def rotate_key(self, host: model.SandboxHost) -> str:
        public = generate_keypair(
            self.host_dir(host.name) / "ssh_host_ed25519_key",
            f"fleet-sandbox-host-{host.name}-rotated",
        )
        cid = self.container(host)
        if cid:
            self._copy_keys(host, cid)
        return public

    # -- running ----------------------------------------------------------------------------
    def _state(self, host: model.SandboxHost) -> dict[str, Any] | None:
        cid = self.container(host)
        if not cid:
            return None
        proc = _docker("inspect", "--format", "{{json .State}}", cid, check=False, timeout=30)
        if proc.returncode != 0:
            return None
        try:
            state: dict[str, Any] = json.loads(proc.stdout)
        except ValueError:
            return None
        return state

    def running(self, host: model.SandboxHost) -> bool:
        state = self._state(host)
        return bool(state and state.get("Running"))

    def paused(self, host: model.SandboxHost) -> bool:
        state = self._state(host)
        return bool(state and state.get("Paused"))

    def start(self, host: model.SandboxHost, *, may_move: bool = False) -> int:
        port = host.port or free_port(host.address)
        for _attempt in range(4):
            cid = self.container(host) or self._create(host, port)
            if self.running(host):
                return port
            mark = len(self.log_text(host))
            proc = _docker("start", cid, check=False, timeout=60)
            if proc.returncode == 0:
                self._wait_ready(host, cid, mark)
                return port
            text = proc.stderr + proc.stdout
            if may_move and ("already allocated" in text or "address already in use" in text):
                _docker("rm", "-f", cid, check=False)
                (self.host_dir(host.name) / "container").unlink(missing_ok=True)
                port = free_port(host.address)
                continue
            raise OperationFailed(f"{host.name}: docker start: {_last_line(proc)}")
        raise OperationFailed(f"{host.name}: no free port on {host.address}")

    def boots_systemd(self, host: model.SandboxHost) -> bool:
        return _read_id(self.host_dir(host.name) / "init") == "systemd"

    def _wait_ready(self, host: model.SandboxHost, cid: str, mark: int) -> None:
        """Wait until this start's sshd listens (a log line after offset ``mark``; under
        systemd, its unit is active)."""
        deadline = time.monotonic() + START_TIMEOUT
        if self.boots_systemd(host):
            while time.monotonic() < deadline:
                check = ["exec", cid, "systemctl", "is-active", "ssh.service"]
                if _docker(*check, check=False, timeout=30).stdout.strip() == "active":
                    return
                time.sleep(0.2)
            status = _docker("exec", cid, "systemctl", "status", "ssh.service", check=False)
            raise OperationFailed(
                f"{host.name}: sshd under systemd in container {cid[:12]} did not start: "
                f"{_last_line(status)}"
            )
        while time.monotonic() < deadline:
            if "Server listening on" in self.log_text(host)[mark:]:
                return
            if not self.running(host):
                break
            time.sleep(0.05)
        raise OperationFailed(
            f"{host.name}: sshd in container {cid[:12]} did not start: "
            f"{model.sshd_error_line(self.log_text(host)[mark:])}"
        )

    def stop(
        self, host: model.SandboxHost, *, kill: bool = False, workloads: bool = False
    ) -> list[int]:
        """Stop the container: every process of the host (workloads included) ends."""
        cid = self.container(host)
        if not cid or not self.running(host):
            return []
        if self.paused(host):
            _docker("unpause", cid, check=False, timeout=60)
        if kill:
            _docker("kill", cid, check=False, timeout=60)
        else:
            _docker("stop", "-t", str(STOP_SECONDS), cid, check=False, timeout=60)
        return []

    def pause(self, host: model.SandboxHost) -> None:
        """Freeze every process of the host (``docker pause``): a peer that neither answers
        nor closes; its published port still accepts TCP connections."""
        cid = self.container(host)
        if not cid or not self.running(host):
            raise OperationFailed(f"{host.name}: not running; cannot pause it")
        _docker("pause", cid, timeout=60)

    def unpause(self, host: model.SandboxHost) -> None:
        cid = self.container(host)
        if cid and self.paused(host):
            _docker("unpause", cid, timeout=60)

    def restart(self, host: model.SandboxHost) -> None:
        """``docker restart``: every process ends, the host comes back on the same port."""
        cid = self.container(host)
        if not cid or not self.running(host):
            self.start(host)
            return
        if self.paused(host):
            _docker("unpause", cid, check=False, timeout=60)
        mark = len(self.log_text(host))
        _docker("restart", "-t", str(STOP_SECONDS), cid, timeout=120)
        self._wait_ready(host, cid, mark)

    # -- files in the host's home and its sessions ------------------------------------------
    def _home_path(self, relpath: str) -> str:
        parts = relpath.split("/")
        if relpath.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise UsageError(f"not a path inside the host's home: {relpath!r}")
        return f"{HOME}/{relpath}"

    def write_home_file(self, host: model.SandboxHost, relpath: str, text: str) -> None:
        """Write ``~/<relpath>`` on the host, atomically (a temporary file and a rename
        inside the container, so its processes never read half a file)."""
        cid = self.container(host)
        if not cid:
            raise OperationFailed(f"{host.name}: no container (is the sandbox up?)")
        path = self._home_path(relpath)
        if not self.running(host):
            with tempfile.TemporaryDirectory(prefix="fleet-docker-") as tmp:
                local = Path(tmp) / "file"
                local.write_text(text, encoding="utf-8")
                _docker("cp", str(local), f"{cid}:{path}", timeout=60)
            return
        proc = subprocess.run(
            ["docker", "exec", "-i", cid, "sh", "-c", _WRITE_FILE, "sh", path],
            input=text.encode("utf-8"),
            capture_output=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            why = proc.stderr.decode("utf-8", "replace").strip() or f"exit {proc.returncode}"
            raise OperationFailed(f"{host.name}: cannot write {path}: {why.splitlines()[-1]}")

    def read_home_file(self, host: model.SandboxHost, relpath: str) -> str | None:
        """``~/<relpath>`` on the host, or None if it does not exist."""
        cid = self.container(host)
        if not cid or not self.running(host):
            return None
        proc = _docker("exec", cid, "cat", self._home_path(relpath), check=False, timeout=60)
        return proc.stdout if proc.returncode == 0 else None

    def cut_sessions(self, host: model.SandboxHost) -> int:
        """SIGKILL the host's live SSH sessions (the per-connection sshd processes below the
        listener, inside the container), as a network cut would end them; the listener
        stays, so clients can reconnect. Returns how many processes were cut."""
        cid = self.container(host)
        if not cid or not self.running(host):
            return 0
        proc = _docker("exec", cid, "sh", "-c", _CUT_SESSIONS, check=False, timeout=60)
        if proc.returncode != 0:
            raise OperationFailed(f"{host.name}: cannot cut sessions: {_last_line(proc)}")
        return len(proc.stdout.split())

    def onhost_scripts(self, host: model.SandboxHost) -> int:
        """How many of fleet's on-host scripts run in the container now."""
        cid = self.container(host)
        if not cid or not self.running(host):
            return 0
        proc = _docker("exec", cid, "pgrep", "-c", "-f", shell.LOADER_NAME, check=False, timeout=30)
        return int(proc.stdout.strip() or 0) if proc.returncode in (0, 1) else 0

    # -- logs -----------------------------------------------------------------------------
    def _log_path(self, cid: str) -> str | None:
        if cid not in _LOG_PATHS:
            proc = _docker("inspect", "--format", "{{.LogPath}}", cid, check=False, timeout=30)
            path = proc.stdout.strip() if proc.returncode == 0 else ""
            _LOG_PATHS[cid] = path if path and os.access(path, os.R_OK) else None
        return _LOG_PATHS[cid]

    def log_text(self, host: model.SandboxHost) -> str:
        """The container's output (sshd's log, ``sshd -e``), growing across restarts."""
        cid = self.container(host)
        if not cid:
            return ""
        path = self._log_path(cid)
        if path is not None:
            with contextlib.suppress(OSError):
                return _json_log_text(Path(path))
        proc = _docker("logs", cid, check=False, timeout=30)
        return proc.stdout + proc.stderr if proc.returncode == 0 else ""

    # -- status ------------------------------------------------------------------------------
    def host_details(self, host: model.SandboxHost) -> dict[str, str]:
        """Container, image and network ids of ``host`` (for ``fleet sandbox status``)."""
        details: dict[str, str] = {"image": self._image(host)}
        cid = self.container(host)
        if cid:
            details["container"] = cid
            image = _docker("inspect", "--format", "{{.Image}}", cid, check=False, timeout=30)
            if image.returncode == 0 and image.stdout.strip():
                details["image_id"] = image.stdout.strip()
        if "image_id" not in details:
            found = image_id(details["image"])
            if found:
                details["image_id"] = found
        network = self.network()
        if network:
            details["network"] = network
        return details

    # -- teardown -------------------------------------------------------------------------
    def _remove_container(self, host: model.SandboxHost) -> None:
        cid = self.container(host)
        if not cid:
            return
        if self.paused(host):
            _docker("unpause", cid, check=False, timeout=60)
        proc = _docker("rm", "-f", cid, check=False, timeout=120)
        if proc.returncode != 0 and "No such container" not in proc.stderr:
            raise OperationFailed(f"{host.name}: docker rm {cid[:12]}: {_last_line(proc)}")
        _LOG_PATHS.pop(cid, None)
        (self.host_dir(host.name) / "container").unlink(missing_ok=True)

    def release(self, hosts: Sequence[model.SandboxHost]) -> None:
        """Remove the (stopped) containers of ``hosts`` and this sandbox's network, by id."""
        for host in hosts:
            self._remove_container(host)
        network = self.network()
        if network:
            proc = _docker("network", "rm", network, check=False, timeout=60)
            if (
                proc.returncode == 0
                or "No such network" in proc.stderr
                or "not found" in proc.stderr
            ):
                self.network_file.unlink(missing_ok=True)
            else:
                raise OperationFailed(f"docker network rm {network[:12]}: {_last_line(proc)}")

    def remove(self, host: model.SandboxHost) -> None:
        """Remove ``host``'s container (if still recorded) and its files."""
        self._remove_container(host)
        shutil.rmtree(self.host_dir(host.name), ignore_errors=True)


def _vllm_publish(host: model.SandboxHost) -> list[str]:
    """``-p`` for the host's vLLM port (the inventory's ``vllm_port``), on 127.0.0.1 at the
    same number: the endpoint fleet reports is reachable from this machine, as on a local
    host (the server inside listens on that port, as the serve profile says)."""
    if not host.vllm_port:
        return []
    return ["-p", f"{host.address}:{host.vllm_port}:{host.vllm_port}"]


def _network_name(network: str) -> str:
    proc = _docker("network", "inspect", "--format", "{{.Name}}", network, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else network[:12]


def _json_log_text(path: Path) -> str:
    """The text of a json-file container log: each line's ``log`` field, in order."""
    parts: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                parts.append(json.loads(line).get("log", ""))
            except ValueError:
                continue  # a line the engine is still writing
    return "".join(parts)


def _short(image: str) -> str:
    return image.removeprefix("sha256:")[:12]

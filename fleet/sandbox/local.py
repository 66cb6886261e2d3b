"""Local backend: every rehearsal host is a real OpenSSH ``sshd`` run as the current user.

Per host, under ``DIR/hosts/<name>/``::

    sshd_config  ssh_host_ed25519_key(.pub)  authorized_keys  session.sh
    sshd.pid       written by sshd once its socket is bound (our readiness signal)
    listener.json  {"pid", "start"}: what ``down`` stops, checked by start time
    sshd.log       sshd's own log (LogLevel VERBOSE: one "Connection from" per connection)
    home/          the host's home: ml-env/ (vLLM files, bin/vllm: the rehearsal vLLM),
                   bin/nvidia-smi, models/ (fleet.sandbox.checkpoints), .fleet-sandbox/
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import venv
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from fleet.errors import OperationFailed
from fleet.localfiles import atomic_write
from fleet.sandbox import model
from fleet.sandbox.procs import ProcessRecord, descendants, environ_of, stop_tree
from fleet.transport import shell

ONHOST_MARK = shell.LOADER_NAME.encode()
SBIN_DIRS = (
    "/usr/sbin",
    "/usr/local/sbin",
    "/sbin",
    "/opt/homebrew/sbin",
    "/usr/local/opt/openssh/sbin",
)
SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/local/libexec/sftp-server",
    "/opt/homebrew/libexec/sftp-server",
)
START_TIMEOUT = 15.0
PORT_ATTEMPTS = 6

# sshd processes this Python process started: reaped when they stop (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def find_sshd() -> Path:
    """The absolute path of OpenSSH's server (sshd refuses to re-exec from a relative one)."""
    found = shutil.which("sshd")
    candidates = [found] if found else []
    candidates += [os.path.join(d, "sshd") for d in SBIN_DIRS]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate).resolve()
    raise OperationFailed(
        "OpenSSH server (sshd) not found; install it (Debian/Ubuntu: openssh-server) "
        "or run the README's test command, which installs it"
    )


def find_sftp_server(sshd: Path) -> Path | None:
    subdirs = ("lib/openssh", "libexec/openssh", "libexec")
    near = [sshd.parent.parent / sub / "sftp-server" for sub in subdirs]
    for candidate in [*map(Path, SFTP_SERVERS), *near]:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def openssh_version(sshd: Path) -> str:
    proc = subprocess.run([str(sshd), "-V"], capture_output=True, text=True, check=False)
    return model.parse_openssh_version(proc.stderr + proc.stdout) or "OpenSSH (unknown version)"


def generate_keypair(path: Path, comment: str) -> str:
    """Write an ed25519 key pair (OpenSSH format, private key mode 0600); return the public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
        + f" {comment}"
    )
    atomic_write(path, private, mode=0o600, dir_mode=0o755)
    write_text_atomic(path.with_name(path.name + ".pub"), public + "\n", mode=0o644)
    return public


def write_text_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """``text`` into ``path``, never half-written (fleet.localfiles.atomic_write; no
    fsync: these are rehearsal files)."""
    atomic_write(path, text, mode=mode, dir_mode=0o755)


@contextmanager
def reserved_ports(address: str, count: int) -> Iterator[list[int]]:
    """``count`` distinct free TCP ports on ``address`` (held open until the block ends)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((address, 0))
            ports.append(int(sock.getsockname()[1]))
        yield ports


def free_port(address: str) -> int:
    with reserved_ports(address, 1) as ports:
        return ports[0]


def account_locked(user: str) -> bool:
    """True if sshd (without PAM) would refuse ``user`` as locked: '!' in /etc/shadow.

    Only root can read the shadow file; an unprivileged sshd cannot either and skips the check.
    """
    if os.geteuid() != 0:
        return False
    try:
        lines = Path("/etc/shadow").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split(":")
        if len(fields) > 1 and fields[0] == user:
            return fields[1].startswith("!")
    return False


class LocalBackend:
    """Rehearsal hosts as local sshd processes under ``root`` (the sandbox directory)."""

    name = "local"

    def __init__(self, root: Path, user: str) -> None:
        self.root = root
        self.user = user
        self.login_user = user  # sshd runs as the current user and lets only that user in
        self._sshd: Path | None = None

    # -- paths -----------------------------------------------------------------------
    def host_dir(self, name: str) -> Path:
        return self.root / "hosts" / name

    def home(self, name: str) -> Path:
        return self.host_dir(name) / "home"

    def log_path(self, name: str) -> Path:
        return self.host_dir(name) / "sshd.log"

    @property
    def sshd(self) -> Path:
        if self._sshd is None:
            self._sshd = find_sshd()
        return self._sshd

    def describe(self) -> str:
        return f"local sshd ({openssh_version(self.sshd)}, {self.sshd})"

    def plan_host(self, name: str, vllm: str, port: int) -> model.SandboxHost:
        home = self.home(name)
        return model.SandboxHost(
            name=name,
            vllm=vllm,
            address=model.ADDRESS,
            port=port,
            home=str(home),
            python=str(home / model.ENV_DIR / "bin" / "python"),
        )

    # -- building a host ---------------------------------------------------------------
    def prepare(
        self, host: model.SandboxHost, tree: Path, client_public_key: str, info: dict[str, Any]
    ) -> None:
        """Create the host's home (vLLM env, nvidia-smi), host key and sshd files."""
        hdir = self.host_dir(host.name)
        home = Path(host.home)
        hdir.mkdir(parents=True, exist_ok=True)
        build_home(home, tree, info)
        generate_keypair(hdir / "ssh_host_ed25519_key", f"fleet-sandbox-host-{host.name}")
        write_text_atomic(hdir / "authorized_keys", client_public_key.strip() + "\n", mode=0o600)
        write_text_atomic(hdir / "session.sh", model.SESSION_WRAPPER, mode=0o755)

    def public_key(self, host: model.SandboxHost) -> str:
        return (self.host_dir(host.name) / "ssh_host_ed25519_key.pub").read_text().strip()

    def rotate_key(self, host: model.SandboxHost) -> str:
        """A new host key (the next start serves it); returns the new public key."""
        return generate_keypair(
            self.host_dir(host.name) / "ssh_host_ed25519_key",
            f"fleet-sandbox-host-{host.name}-rotated",
        )

    def _write_config(self, host: model.SandboxHost, port: int) -> Path:
        hdir = self.host_dir(host.name)
        sftp = find_sftp_server(self.sshd)
        path = ":".join(
            [
                str(Path(host.home) / "bin"),
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ]
        )
        text = model.render_sshd_config(
            port=port,
            address=host.address,
            host_key=str(hdir / "ssh_host_ed25519_key"),
            pid_file=str(hdir / "sshd.pid"),
            authorized_keys=str(hdir / "authorized_keys"),
            user=self.user,
            home=host.home,
            path=path,
            session_wrapper=str(hdir / "session.sh"),
            sftp_server=str(sftp) if sftp else None,
            use_pam=account_locked(self.user),
        )
        cfg = hdir / "sshd_config"
        write_text_atomic(cfg, text, mode=0o600)
        return cfg

    # -- running -------------------------------------------------------------------------
    def record(self, host: model.SandboxHost) -> ProcessRecord | None:
        """The listener sshd of ``host`` if it is running (pid file + start time agree)."""
        try:
            text = (self.host_dir(host.name) / "listener.json").read_text()
        except OSError:
            return None
        record = ProcessRecord.from_json(text)
        return record if record and record.alive() else None

    def running(self, host: model.SandboxHost) -> bool:
        return self.record(host) is not None

    def start(self, host: model.SandboxHost, *, may_move: bool = False) -> int:
        """Start ``host``'s sshd; return its port. ``may_move``: pick another port if taken."""
        if self.running(host):
            return host.port
        port = host.port or free_port(host.address)
        created_privsep = False
        for _attempt in range(PORT_ATTEMPTS):
            ok, log_text = self._spawn(host, port)
            if ok:
                return port
            missing = model.sshd_missing_privsep_dir(log_text)
            if missing and not created_privsep and os.geteuid() == 0:
                # sshd run by root wants its (empty) privilege-separation directory.
                Path(missing).mkdir(mode=0o755, parents=True, exist_ok=True)
                created_privsep = True
                continue
            if model.sshd_bind_failed(log_text) and may_move:
                port = free_port(host.address)
                continue
            raise OperationFailed(
                f"{host.name}: sshd did not start on {host.address}:{port}: "
                f"{model.sshd_error_line(log_text)} (log: {self.log_path(host.name)})"
            )
        raise OperationFailed(f"{host.name}: sshd found no free port on {host.address}")

    def _spawn(self, host: model.SandboxHost, port: int) -> tuple[bool, str]:
        hdir = self.host_dir(host.name)
        cfg = self._write_config(host, port)
        pid_file = hdir / "sshd.pid"
        pid_file.unlink(missing_ok=True)
        log_path = self.log_path(host.name)
        offset = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [str(self.sshd), "-D", "-f", str(cfg), "-E", str(log_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=hdir,
                start_new_session=True,
                close_fds=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                if int(pid_file.read_text().strip() or 0) == proc.pid:
                    record = ProcessRecord.of(proc.pid)
                    if record is not None:
                        _CHILDREN[proc.pid] = proc
                        write_text_atomic(hdir / "listener.json", record.to_json() + "\n")
                        return True, ""
            except (OSError, ValueError):
                pass
            time.sleep(0.01)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            return False, fh.read().decode(errors="replace")

    def stop(
        self, host: model.SandboxHost, *, kill: bool = False, workloads: bool = False
    ) -> list[int]:
        """Stop the listener sshd of ``host`` and every process below it.

        ``kill``: SIGKILL at once (a crash, for tests). ``workloads``: also stop processes
        registered in ``home/.fleet-sandbox/run/*.pid`` that run in this host's home.
        """
        hdir = self.host_dir(host.name)
        stopped: list[int] = []
        self.unpause(host)  # a stopped (SIGSTOP) process would hold SIGTERM back
        record = self.record(host)
        if record is not None:
            stopped += stop_tree(record, kill=kill)
            proc = _CHILDREN.pop(record.pid, None)
            if proc is not None:
                proc.wait(timeout=5)
        (hdir / "listener.json").unlink(missing_ok=True)
        if workloads:
            stopped += stop_workloads(Path(host.home))
        return stopped

    def cut_sessions(self, host: model.SandboxHost) -> int:
        """SIGKILL the host's live SSH sessions (the per-connection sshd processes), as a
        network cut would end them; the listener stays, so clients can reconnect."""
        record = self.record(host)
        if record is None:
            return 0
        cut = 0
        for proc in session_processes(record):
            if proc.signal(signal.SIGKILL):
                cut += 1
        return cut

    def onhost_scripts(self, host: model.SandboxHost) -> int:
        """How many of fleet's on-host scripts run in the host's SSH sessions now."""
        record = self.record(host)
        if record is None:
            return 0
        return sum(1 for pid in descendants(record.pid) if _is_onhost_script(pid))

    def log_text(self, host: model.SandboxHost) -> str:
        try:
            return self.log_path(host.name).read_text(errors="replace")
        except OSError:
            return ""

    def remove(self, host: model.SandboxHost) -> None:
        shutil.rmtree(self.host_dir(host.name), ignore_errors=True)

    # -- faults and teardown (see HostBackend in fleet.sandbox.core) ------------------------
    def _tree(self, host: model.SandboxHost) -> list[ProcessRecord]:
        record = self.record(host)
        if record is None:
            return []
        below = (ProcessRecord.of(p) for p in descendants(record.pid))
        return [record, *(r for r in below if r is not None)]

    def pause(self, host: model.SandboxHost) -> None:
        """SIGSTOP the listener sshd and every process below it: a stalled peer."""
        tree = self._tree(host)
        if not tree:
            raise OperationFailed(f"{host.name}: not running; cannot pause it")
        for record in tree:
            record.signal(signal.SIGSTOP)

    def unpause(self, host: model.SandboxHost) -> None:
        for record in reversed(self._tree(host)):
            record.signal(signal.SIGCONT)

    def restart(self, host: model.SandboxHost) -> None:
        """Every process of the host ends (workloads too); sshd starts again, same port."""
        self.stop(host, workloads=True)
        self.start(host)

    def release(self, hosts: Sequence[model.SandboxHost]) -> None:
        """Nothing beyond the stopped processes and the files (removed by ``remove``)."""

    def host_details(self, host: model.SandboxHost) -> dict[str, str]:
        record = self.record(host)
        return {"pid": str(record.pid)} if record is not None else {}


def stop_workloads(home: Path) -> list[int]:
    """Stop the processes a host started for itself: those registered in
    ``home/.fleet-sandbox/run/*.pid``, and every daemon a session left behind (fleet's
    supervisord and the servers under it): processes whose environment has this host's
    ``HOME`` and ``FLEET_SANDBOX=1``, as every process started over its ssh has.

    A pid is signalled only after that check (and its start time) so a recycled pid or a
    process of another sandbox is left alone."""
    stopped: list[int] = []
    for pid in _daemons_of(home):
        record = ProcessRecord.of(pid)
        if record is not None:
            stopped += stop_tree(record)
    run_dir = home / ".fleet-sandbox" / "run"
    for pid_file in sorted(run_dir.glob("*.pid")) if run_dir.is_dir() else []:
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        env = environ_of(pid)
        record = ProcessRecord.of(pid)
        if record is None or env is None or env.get("HOME") != str(home):
            continue
        stopped += stop_tree(record)
        pid_file.unlink(missing_ok=True)
    return stopped


def _daemons_of(home: Path) -> list[int]:
    """Processes of this user started in a session of the host whose home is ``home``."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == me:
            continue
        env = environ_of(int(entry))
        if env and env.get("FLEET_SANDBOX") == "1" and env.get("HOME") == str(home):
            found.append(int(entry))
    return sorted(found)


def session_processes(listener: ProcessRecord) -> list[ProcessRecord]:
    """The per-connection sshd processes below a listener (not the listener itself)."""
    children = [ProcessRecord.of(p) for p in descendants(listener.pid)]
    return [c for c in children if c is not None and _is_sshd(c.pid)]


def _is_onhost_script(pid: int) -> bool:
    try:
        return ONHOST_MARK in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _is_sshd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sshd"
    except OSError:
        return False


def build_home(home: Path, tree: Path, info: dict[str, Any]) -> None:
    """A rehearsal host's home: ``ml-env`` holding the real vLLM files and the rehearsal
    ``vllm`` executable, ``bin/nvidia-smi``, ``models/`` (target and drafter checkpoints)."""
    from fleet.sandbox.checkpoints import build_models

    env = home / model.ENV_DIR
    if info.get("engine") == "real":
        build_real_home(home, str(info["vllm"]), info)
        return
    venv.EnvBuilder(with_pip=False, symlinks=(os.name != "nt"), clear=True).create(env)
    site = Path(model.site_packages(str(env), sys.version_info[:2]))
    site.mkdir(parents=True, exist_ok=True)
    for item in sorted(tree.iterdir()):
        if item.name == "vllm" or item.name.endswith(".dist-info"):
            shutil.copytree(item, site / item.name, dirs_exist_ok=True)
    install_nvidia_smi(home, python=str(env / "bin" / "python"))
    if info.get("ray"):
        from fleet.sandbox.ray_env import install_ray

        install_ray(env, str(env / "bin" / "python"))
    install_vllm(env, python=str(env / "bin" / "python"))
    build_models(home)
    write_text_atomic(home / ".fleet-sandbox" / "host.json", json.dumps(info, indent=2) + "\n")
    (home / ".fleet-sandbox" / "run").mkdir(parents=True, exist_ok=True)


def build_real_home(home: Path, version: str, info: dict[str, Any]) -> None:
    """A host running the real vLLM CPU engine (fleet.sandbox.real_engine): its ml-env,
    the tiny models under the profiles' names, the nvidia-smi stand-in (one GPU: preflight
    asks it, vLLM runs on the CPU)."""
    from fleet.sandbox.real_engine.host import install_host
    from fleet.sandbox.real_engine.models import link_models, tiny_models

    python = install_host(home / model.ENV_DIR, version)
    install_nvidia_smi(home, python=str(python))
    link_models(tiny_models(), home / model.MODELS_DIR)
    write_text_atomic(home / ".fleet-sandbox" / "host.json", json.dumps(info, indent=2) + "\n")
    (home / ".fleet-sandbox" / "run").mkdir(parents=True, exist_ok=True)


def install_nvidia_smi(home: Path, *, python: str) -> Path:
    """``home/bin/nvidia-smi``: a sh launcher running the stand-in with the host's Python."""
    from fleet.onhost.rehearsal import nvidia_smi

    script = home / ".fleet-sandbox" / "nvidia_smi.py"
    write_text_atomic(script, Path(nvidia_smi.__file__).read_text(encoding="utf-8"))
    launcher = home / "bin" / "nvidia-smi"
    write_text_atomic(
        launcher,
        "#!/bin/sh\n# fleet sandbox stand-in for NVIDIA's nvidia-smi (8 x NVIDIA B200)\n"
        + shell.script('exec {{argv}} "$@"', argv=[python, str(script)])
        + "\n",
        mode=0o755,
    )
    return launcher


def install_vllm(env: Path, *, python: str) -> Path:
    """``env/bin/vllm``: the rehearsal vLLM (``fleet/onhost/rehearsal/vllm_sim.py``) as an
    executable run by the environment's ``python``, where pip puts vLLM's console script."""
    from fleet.onhost.client import executable

    path = env / "bin" / "vllm"
    write_text_atomic(path, executable("rehearsal.vllm_sim", "main", python), mode=0o755)
    return path


def stage_rehearsal_files(root: Path, *, home: str = "/root", python: str | None = None) -> None:
    """The rehearsal vLLM and the checkpoints of a host whose home is ``home``, written
    under ``root`` (e.g. a container image's overlay of ``/``): ``root/<home>/ml-env/bin/
    vllm`` (run by ``python``, default the env's) and ``root/<home>/models/``.

    For backends that build a host's files elsewhere than in a local home (docker's
    ``stage_serve_files(overlay, version)`` is ``stage_rehearsal_files(overlay)``)."""
    from fleet.onhost.client import executable
    from fleet.sandbox.checkpoints import build_models

    base = root / home.lstrip("/")
    interpreter = python or str(PurePosixPath(home) / model.ENV_DIR / "bin" / "python")
    write_text_atomic(
        base / model.ENV_DIR / "bin" / "vllm",
        executable("rehearsal.vllm_sim", "main", interpreter),
        mode=0o755,
    )
    build_models(base)

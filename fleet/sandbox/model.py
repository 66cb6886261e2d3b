"""The sandbox's pure core: host plans, its state file, sshd_config, inventory, log reading.

Nothing here touches the network, processes or the file system; ``fleet.sandbox.local``,
``fleet.sandbox.docker`` and ``fleet.sandbox.core`` put it to work.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from fleet.errors import UsageError

DEFAULT_HOSTS = 3
MAX_HOSTS = 128
DEFAULT_VERSIONS = ("0.17.0", "0.18.0")
DEFAULT_LOAD_SECONDS = 20.0
DEFAULT_DIR = ".sandbox"
STATE_FILE = "sandbox.json"
INVENTORY_FILE = "inventory.yaml"
KNOWN_HOSTS_FILE = "known_hosts"
HOST_NAME_PREFIX = "sandbox-"
SANDBOX_GROUP = "sandbox"
ADDRESS = "127.0.0.1"
ENV_DIR = "ml-env"  # the vLLM environment inside a host's home, as on real hosts
MODELS_DIR = "models"  # target and drafter checkpoints inside a host's home

SandboxBackend = Literal["local", "docker"]
# what serves on the hosts: the rehearsal vLLM this project wrote, or vLLM itself (its CPU
# build with tiny models: fleet.sandbox.real_engine)
SandboxEngine = Literal["rehearsal", "real"]
# the inventory variables of a host on the real engine: one "GPU" (vLLM runs on the CPU),
# a model length the 1 GiB CPU KV cache holds with the drafter, eager mode (compiling
# takes a minute on 2 cores), Kimi-K2.5 served as text only (its tiny vision tower is a
# stand-in)
REAL_ENGINE_VARS = {
    "tensor_parallel_size": "1",
    "max_model_len": "4096",
    # (a text-only model ignores the multimodal limit: vLLM reads it for multimodal ones)
    "vllm_extra_args": """--enforce-eager --limit-mm-per-prompt '{"vision_chunk":0}'""",
}

_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)+([a-z]+[0-9]*)?(\.post[0-9]+)?$")
# sshd_config has no escape for '"'; '%' starts a token in several keywords.
_UNSAFE_PATH_CHARS = set('"%\\\n\r\t\0')


class SandboxHost(BaseModel):
    """One rehearsal host: where it listens, what it runs, where its files are."""

    model_config = ConfigDict(extra="forbid")

    name: str
    vllm: str
    address: str = ADDRESS
    port: int = 0
    home: str = Field(description="the host's home directory, as the host sees it")
    python: str = Field(description="interpreter of the host's vLLM environment")
    container: str | None = Field(default=None, description="docker backend: container id")
    vllm_port: int | None = Field(
        default=None, description="the port this host's vLLM serves on (inventory var)"
    )
    extra_vars: dict[str, str] = Field(
        default_factory=dict, description="more inventory vars (Sandbox.set_host_var)"
    )


class SandboxState(BaseModel):
    """``DIR/sandbox.json``: everything ``down``/``status`` need, written by ``up``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    backend: SandboxBackend = "local"
    dir: str
    user: str
    load_seconds: float = DEFAULT_LOAD_SECONDS
    engine: SandboxEngine = "rehearsal"
    versions: list[str]
    hosts: list[SandboxHost]

    def host(self, name: str) -> SandboxHost:
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts)
        raise UsageError(f"no sandbox host named {name!r} (hosts: {known})")


def validate_version(version: str) -> str:
    """A vLLM release number such as ``0.17.0`` (never a pip option or a path)."""
    version = version.strip()
    if not _VERSION_RE.match(version):
        raise UsageError(f"--vllm {version!r}: not a vLLM version (expected e.g. 0.17.0)")
    return version


def validate_hosts(count: int) -> int:
    if not 1 <= count <= MAX_HOSTS:
        raise UsageError(f"--hosts {count}: must be between 1 and {MAX_HOSTS}")
    return count


def validate_dir(path: str) -> str:
    """The sandbox directory ends up in sshd_config: refuse characters it cannot quote."""
    bad = sorted(_UNSAFE_PATH_CHARS.intersection(path))
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise UsageError(f"--dir {path!r}: sandbox directory may not contain {shown}")
    return path


def host_names(count: int) -> list[str]:
    width = max(2, len(str(count)))
    return [f"{HOST_NAME_PREFIX}{i:0{width}d}" for i in range(1, count + 1)]


def assign_versions(count: int, versions: Sequence[str]) -> list[str]:
    """vLLM versions for ``count`` hosts, round-robin over ``versions`` in the order given."""
    if not versions:
        raise UsageError("at least one --vllm version is needed")
    return [versions[i % len(versions)] for i in range(count)]


def group_name(version: str) -> str:
    """Inventory group of the hosts running ``version``: ``vllm_0_17_0``."""
    return "vllm_" + re.sub(r"[^A-Za-z0-9]", "_", version)


def site_packages(env: str, python_version: tuple[int, int]) -> str:
    return str(
        PurePosixPath(env)
        / "lib"
        / f"python{python_version[0]}.{python_version[1]}"
        / "site-packages"
    )


def _q(value: str) -> str:
    """A double-quoted sshd_config argument."""
    validate_dir(value)
    return f'"{value}"'


def render_sshd_config(
    *,
    port: int,
    address: str,
    host_key: str,
    pid_file: str,
    authorized_keys: str,
    user: str,
    home: str,
    path: str,
    session_wrapper: str | None,
    sftp_server: str | None,
    use_pam: bool = False,
) -> str:
    """sshd_config of one rehearsal host, run as the current user without root.

    ``SetEnv HOME=...`` plus a ``ForceCommand`` wrapper that ``cd``s there give every host
    its own home (sshd itself always starts sessions in the user's passwd home). The wrapper
    runs the client's command with the user's shell exactly as sshd would. SFTP goes through
    the wrapper too, so it needs an external ``sftp-server`` (``internal-sftp`` cannot be
    forced); without one, sessions start in the real home and SFTP is served internally.
    """
    lines = [
        "# fleet sandbox: one rehearsal host (generated; `fleet sandbox down` stops it)",
        f"Port {port}",
        f"ListenAddress {address}",
        f"HostKey {_q(host_key)}",
        f"PidFile {_q(pid_file)}",
        f"AuthorizedKeysFile {_q(authorized_keys)}",
        f"AllowUsers {user}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        f"UsePAM {'yes' if use_pam else 'no'}",
        "StrictModes no",
        "PermitUserEnvironment no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "AllowAgentForwarding no",
        "AllowTcpForwarding yes",
        "MaxSessions 64",
        "MaxStartups 64:30:256",
        "LoginGraceTime 30",
        "ClientAliveInterval 15",
        "ClientAliveCountMax 4",
        "LogLevel VERBOSE",
        f"SetEnv HOME={_q(home)} PATH={_q(path)} FLEET_SANDBOX=1",
    ]
    if session_wrapper and sftp_server:
        lines.append(f"ForceCommand exec {_q(session_wrapper)}")
        lines.append(f"Subsystem sftp {_q(sftp_server)}")
    else:
        lines.append("Subsystem sftp internal-sftp")
    return "\n".join(lines) + "\n"


SESSION_WRAPPER = """#!/bin/sh
# fleet sandbox: start every session in this rehearsal host's own home, then run the
# client's command with the user's shell exactly as sshd would.
cd "$HOME" || exit 1
if [ -n "${SSH_ORIGINAL_COMMAND+x}" ]; then
    exec "${SHELL:-/bin/sh}" -c "$SSH_ORIGINAL_COMMAND"
fi
exec "${SHELL:-/bin/sh}" -l
"""


def known_hosts_line(address: str, port: int, public_key: str) -> str:
    """A known_hosts entry: ``[addr]:port keytype base64`` (plain ``addr`` on port 22)."""
    parts = public_key.split()
    if len(parts) < 2:
        raise ValueError(f"not an OpenSSH public key: {public_key!r}")
    target = address if port == 22 else f"[{address}]:{port}"
    return f"{target} {parts[0]} {parts[1]}"


def render_inventory(
    state: SandboxState, *, ssh_key: str, known_hosts: str, secrets_env: str | None = None
) -> str:
    """``DIR/inventory.yaml`` (docs/contracts.md, the Ansible-style inventory).

    Every host sits in group ``sandbox`` (in order, with its variables) and in the group of
    its vLLM version (``vllm_0_17_0``), so ``--host vllm_0_18_0`` selects by version.
    """
    hosts: dict[str, dict[str, object]] = {}
    for h in state.hosts:
        entry: dict[str, object] = {"address": h.address, "port": h.port, "python": h.python}
        # where the rehearsal checkpoints are (fleet.sandbox.checkpoints) and a port of its own
        # (every local host shares 127.0.0.1), for serve profiles: {{ models_dir }}/Kimi-K2.5
        entry["models_dir"] = str(PurePosixPath(h.home) / MODELS_DIR)
        if h.vllm_port:
            entry["vllm_port"] = h.vllm_port
        entry.update(h.extra_vars)
        hosts[h.name] = entry
    children: dict[str, dict[str, dict[str, dict[str, object]]]] = {SANDBOX_GROUP: {"hosts": hosts}}
    for host in state.hosts:
        group = children.setdefault(group_name(host.vllm), {"hosts": {}})
        group["hosts"][host.name] = {}
    all_vars: dict[str, object] = {
        "user": state.user,
        "ssh_key": ssh_key,
        "known_hosts": known_hosts,
    }
    if secrets_env:
        all_vars["secrets_env"] = secrets_env  # serve profiles' secrets (VLLM_API_KEY)
    doc = {"all": {"vars": all_vars, "children": children}}
    header = (
        f"# fleet sandbox inventory, written by `fleet sandbox up` ({len(state.hosts)} hosts,"
        f" {state.backend} backend).\n"
        f"# Groups: {SANDBOX_GROUP} (every host) and one per vLLM version"
        f" ({', '.join(group_name(v) for v in dict.fromkeys(h.vllm for h in state.hosts))}).\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


_CONNECTION_RE = re.compile(r"^Connection from (\S+) port (\d+) on (\S+) port (\d+)")
_ACCEPTED_RE = re.compile(r"^Accepted (\S+) for (\S+) from (\S+) port (\d+)")
_SYSLOG_PREFIX = re.compile(r"^(?:\S+ +\d+ [\d:]+ \S+ sshd\[\d+\]: |sshd\[\d+\]: )")


def _strip(line: str) -> str:
    return _SYSLOG_PREFIX.sub("", line.strip())


def count_connections(log_text: str) -> int:
    """TCP connections sshd accepted, from its ``LogLevel VERBOSE`` log."""
    return sum(1 for line in log_text.splitlines() if _CONNECTION_RE.match(_strip(line)))


def count_logins(log_text: str) -> int:
    """Successful authentications (``Accepted publickey for ...``)."""
    return sum(1 for line in log_text.splitlines() if _ACCEPTED_RE.match(_strip(line)))


_BIND_FAILED_RE = re.compile(r"Bind to port \d+ on \S+ failed|Cannot bind any address")
_PRIVSEP_DIR_RE = re.compile(r"Missing privilege separation directory: (\S+)")


def sshd_bind_failed(log_text: str) -> bool:
    return bool(_BIND_FAILED_RE.search(log_text))


def sshd_missing_privsep_dir(log_text: str) -> str | None:
    match = _PRIVSEP_DIR_RE.search(log_text)
    return match.group(1) if match else None


def sshd_error_line(log_text: str) -> str:
    """The line that best explains why sshd did not start (the first specific complaint)."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    words = (
        "fatal",
        "error",
        "cannot",
        "failed",
        "missing",
        "bad ",
        "unsupported",
        "invalid",
        "permission",
        "no such",
        "not ",
    )
    complaints = [line for line in lines if any(w in line.lower() for w in words)]
    specific = [line for line in complaints if "terminating" not in line.lower()]
    if specific or complaints:
        return (specific or complaints)[0]
    return lines[-1] if lines else "sshd exited without a message"


def parse_openssh_version(text: str) -> str | None:
    match = re.search(r"OpenSSH_[0-9][\w.]*", text)
    return match.group(0) if match else None

"""Pinned host keys: strict checking and the ``fleet trust`` flow.

Host keys live in an OpenSSH ``known_hosts`` file (the fleet's pinned keys; per host
variable ``known_hosts``, default ``~/.ssh/known_hosts``). An unknown key is refused, a
changed key is refused; ``fleet trust --accept-new`` pins keys seen for the first time and
never replaces a changed one (OpenSSH's ``StrictHostKeyChecking=accept-new``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import paramiko

_write_lock = threading.Lock()

TrustStatus = Literal["pinned", "unknown", "changed", "added"]


def known_hosts_name(address: str, port: int) -> str:
    """The name a host is filed under in known_hosts (``[addr]:port`` off port 22)."""
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def load_known_hosts(path: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    if path.exists():
        keys.load(str(path))
    return keys


@dataclass(frozen=True)
class KeyCheck:
    status: TrustStatus
    key_type: str
    fingerprint: str
    pinned_fingerprint: str | None = None


def check_key(path: Path, name: str, key: paramiko.PKey) -> KeyCheck:
    """Compare a server key with the pinned keys (pure apart from reading the file)."""
    entry = load_known_hosts(path).lookup(name)
    fp = fingerprint(key)
    if not entry:
        return KeyCheck("unknown", key.get_name(), fp)
    pinned = entry.get(key.get_name())
    if pinned is None:
        # A key of another type is pinned: OpenSSH would negotiate that type. Treat a
        # different key type as a changed identity rather than quietly adding one.
        other = next(iter(entry.values()))
        return KeyCheck("changed", key.get_name(), fp, fingerprint(other))
    if pinned.asbytes() == key.asbytes():
        return KeyCheck("pinned", key.get_name(), fp, fp)
    return KeyCheck("changed", key.get_name(), fp, fingerprint(pinned))


def pin_key(path: Path, name: str, key: paramiko.PKey) -> None:
    """Append ``name keytype base64`` to known_hosts atomically (temp file + rename)."""
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    with _write_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        old = path.read_text() if path.exists() else ""
        if old and not old.endswith("\n"):
            old += "\n"
        fd, tmp = tempfile.mkstemp(prefix=".known_hosts.", dir=str(path.parent))
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(old + line)
                fh.flush()
                os.fsync(fh.fileno())
            if path.exists():
                os.chmod(tmp, path.stat().st_mode & 0o777)
            else:
                os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"host key for {hostname} is not pinned")
        self.hostname = hostname
        self.key = key


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    """Never accept a key silently (paramiko's default in Fabric is AutoAddPolicy)."""

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise UnknownHostKey(hostname, key)

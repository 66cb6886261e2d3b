"""Pinned host keys: strict checking and the ``fleet trust`` flow.

Host keys live in an OpenSSH ``known_hosts`` file (the fleet's pinned keys; per host
variable ``known_hosts``, default ``~/.ssh/known_hosts``). An unknown key is refused, a
changed key is refused, a key marked ``@revoked`` is refused; ``fleet trust --accept-new``
pins keys seen for the first time and never replaces a changed one (OpenSSH's
``StrictHostKeyChecking=accept-new``).

The file is read with OpenSSH's semantics (``sshd(8)``, "SSH_KNOWN_HOSTS FILE FORMAT"),
by fleet's own linear parser rather than paramiko's loader:

- blank lines, ``#`` comments and every line OpenSSH cannot use are skipped: garbage, an
  unknown ``@marker``, an unknown key type, bad base64, a key blob of another type than
  its line says, bytes that are not UTF-8 (only host patterns need to be text);
- host fields are comma-separated patterns (``*``, ``?``, ``!negation``), matched
  case-insensitively, or one hashed name ``|1|salt|hmac`` (HMAC-SHA1 of the name);
- ``@revoked`` keys are refused for the hosts they match, even when also listed plainly;
  ``@cert-authority`` lines are kept aside (fleet verifies plain keys, not certificates);
- only a regular file is read (a FIFO, a device or a directory is refused at once, never
  waited on), at most :data:`MAX_KNOWN_HOSTS_BYTES`.

Writes (``pin_key``) go through a symlink to its target, refuse a target that is not a
regular file, and append under an exclusive ``flock`` so that concurrent ``fleet trust``
runs never lose a key.
"""

from __future__ import annotations

import base64
import binascii
import errno
import fcntl
import hashlib
import hmac
import os
import re
import stat
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import paramiko

from fleet.errors import HostKeyError, UsageError

MAX_KNOWN_HOSTS_BYTES = 64 * 1024 * 1024
"""A known_hosts file larger than this is refused (some 100,000 RSA or 600,000 Ed25519 keys)."""

KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
    }
)
"""Key types fleet can verify (paramiko's); lines with others are skipped, as OpenSSH skips
types it does not know."""

_write_lock = threading.Lock()
_cache_lock = threading.Lock()
_cache: dict[str, tuple[tuple[int, ...], KnownHosts]] = {}
_CACHE_SIZE = 16

TrustStatus = Literal["pinned", "unknown", "changed", "added"]

# A name fleet writes into known_hosts: host, IPv4, IPv6 (with %zone) or [host]:port.
_PINNABLE_RE = re.compile(r"^(?:[A-Za-z0-9_.%:-]+|\[[A-Za-z0-9_.%:-]+\]:[0-9]{1,5})$")


class KnownHostsError(UsageError):
    """The known_hosts file cannot be used: not a regular file, too large, unreadable or
    unwritable (exit 2: a problem with fleet's input, not with the host)."""


def known_hosts_name(address: str, port: int) -> str:
    """The name a host is filed under in known_hosts (``[addr]:port`` off port 22)."""
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# -- parsing ------------------------------------------------------------------------------


def glob_match(text: str, pattern: str) -> bool:
    """OpenSSH's ``match_pattern``: ``*`` any run, ``?`` one character, nothing else
    special. Iterative with one backtrack point: O(len(text) * len(pattern)) at worst."""
    t = p = 0
    star_p = -1
    star_t = 0
    while t < len(text):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == text[t]):
            t += 1
            p += 1
        elif p < len(pattern) and pattern[p] == "*":
            star_p, star_t = p, t
            p += 1
        elif star_p >= 0:
            p = star_p + 1
            star_t += 1
            t = star_t
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def match_host_patterns(name: str, patterns: tuple[str, ...]) -> bool:
    """OpenSSH's ``match_hostname``: true when a pattern matches and no negated one does
    (``name`` is compared lowercased, as ssh lowercases host names)."""
    host = name.lower()
    positive = False
    for raw in patterns:
        negated = raw.startswith("!")
        pattern = (raw[1:] if negated else raw).lower()
        if glob_match(host, pattern):
            if negated:
                return False
            positive = True
    return positive


def _hashed_match(name: str, field_text: str) -> bool:
    """``|1|base64(salt)|base64(HMAC-SHA1(salt, name))``, as ``ssh-keygen -H`` writes."""
    parts = field_text.split("|")
    if len(parts) != 4 or parts[0] != "" or parts[1] != "1":
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
        want = base64.b64decode(parts[3], validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(salt) != hashlib.sha1().digest_size:
        return False
    for candidate in {name, name.lower()}:
        got = hmac.digest(salt, candidate.encode("utf-8", "surrogateescape"), "sha1")
        if hmac.compare_digest(got, want):
            return True
    return False


@dataclass(frozen=True)
class KnownHostsEntry:
    """One usable line of known_hosts."""

    lineno: int
    marker: Literal["", "cert-authority", "revoked"]
    hosts: str
    key_type: str
    blob: bytes

    @property
    def hashed(self) -> bool:
        return self.hosts.startswith("|")

    @property
    def patterns(self) -> tuple[str, ...]:
        return tuple(self.hosts.split(","))

    def matches(self, name: str) -> bool:
        if self.hashed:
            return _hashed_match(name, self.hosts)
        return match_host_patterns(name, self.patterns)

    def key(self) -> paramiko.PKey | None:
        """The key as paramiko's object (None when paramiko cannot build it)."""
        try:
            key = paramiko.PKey.from_type_string(self.key_type, self.blob)
        except Exception:  # a malformed blob: OpenSSH skips the line, so do we
            return None
        return key if key.get_name() == self.key_type else None


def _blob_type(blob: bytes) -> str | None:
    """The key type named inside an SSH public key blob (its first string)."""
    if len(blob) < 4:
        return None
    (length,) = struct.unpack(">I", blob[:4])
    if length == 0 or length > 64 or len(blob) < 4 + length:
        return None
    try:
        return blob[4 : 4 + length].decode("ascii")
    except UnicodeDecodeError:
        return None


_MARKERS: dict[str, Literal["cert-authority", "revoked"]] = {
    "@cert-authority": "cert-authority",
    "@revoked": "revoked",
}


def parse_line(raw: bytes, lineno: int = 0) -> KnownHostsEntry | None:
    """One line of known_hosts -> an entry, or None for a line OpenSSH would skip."""
    text = raw.decode("utf-8", "surrogateescape")
    fields = text.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker: Literal["", "cert-authority", "revoked"] = ""
    if fields[0].startswith("@"):
        found = _MARKERS.get(fields[0])
        if found is None:  # an unknown marker: OpenSSH skips the line
            return None
        marker = found
        fields = fields[1:]
    if len(fields) < 3:
        return None
    hosts, key_type, b64 = fields[0], fields[1], fields[2]
    if key_type not in KEY_TYPES:
        return None
    try:
        blob = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    if _blob_type(blob) != key_type:
        return None
    try:
        hosts.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes in the host field: no name matches
        return None
    return KnownHostsEntry(lineno, marker, hosts, key_type, blob)


_WILDCARD = re.compile(r"[*?!]")
_PORTED = re.compile(r"\[(?P<host>[^\]]+)\]:(?P<port>[0-9]+)")


def _bare_host(name: str) -> str | None:
    """``host`` for ``[host]:port`` off port 22 (OpenSSH's "without port identifier")."""
    m = _PORTED.fullmatch(name)
    return m["host"] if m and int(m["port"]) not in (0, 22) else None


@dataclass(frozen=True)
class KeyVerdict:
    status: Literal["pinned", "unknown", "changed", "revoked"]
    pinned: paramiko.PKey | None = None
    """The pinned key the offered one was compared with (for its fingerprint)."""


@dataclass
class KnownHosts:
    """The usable content of one known_hosts file, indexed for lookups in O(1) per plain
    host name (hashed and wildcard lines are checked one by one, as OpenSSH does)."""

    path: str = ""
    entries: list[KnownHostsEntry] = field(default_factory=list)
    revoked: list[KnownHostsEntry] = field(default_factory=list)
    cert_authorities: list[KnownHostsEntry] = field(default_factory=list)
    skipped: int = 0
    """Non-blank, non-comment lines that could not be used (OpenSSH skips them too)."""
    _by_name: dict[str, list[KnownHostsEntry]] = field(default_factory=dict, repr=False)
    _scan: list[KnownHostsEntry] = field(default_factory=list, repr=False)
    _memo: dict[str, list[KnownHostsEntry]] = field(default_factory=dict, repr=False)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def parse(cls, data: bytes, path: str = "") -> KnownHosts:
        known = cls(path=path)
        for lineno, raw in enumerate(data.split(b"\n"), 1):
            stripped = raw.strip()
            if not stripped or stripped.startswith(b"#"):
                continue
            entry = parse_line(stripped, lineno)
            if entry is None:
                known.skipped += 1
            elif entry.marker == "revoked":
                known.revoked.append(entry)
            elif entry.marker == "cert-authority":
                known.cert_authorities.append(entry)
            else:
                known._index(entry)
        return known

    def _index(self, entry: KnownHostsEntry) -> None:
        self.entries.append(entry)
        if entry.hashed or _WILDCARD.search(entry.hosts):
            self._scan.append(entry)
            return
        for name in dict.fromkeys(p.lower() for p in entry.patterns if p):
            self._by_name.setdefault(name, []).append(entry)

    def _matching(self, name: str) -> list[KnownHostsEntry]:
        with self._memo_lock:
            hit = self._memo.get(name)
        if hit is not None:
            return hit
        found = list(self._by_name.get(name.lower(), []))
        found += [e for e in self._scan if e.matches(name)]
        found.sort(key=lambda e: e.lineno)
        with self._memo_lock:
            self._memo[name] = found
        return found

    def is_revoked(self, name: str, key: paramiko.PKey) -> bool:
        """``key`` is listed ``@revoked`` for a pattern matching ``name``."""
        blob = key.asbytes()
        return any(e.blob == blob and e.matches(name) for e in self.revoked)

    def keys_for(self, name: str) -> list[paramiko.PKey]:
        """The pinned keys of ``name``, file order, revoked ones left out."""
        revoked = {e.blob for e in self.revoked if e.matches(name)}
        keys: list[paramiko.PKey] = []
        seen: set[bytes] = set()
        for entry in self._matching(name):
            if entry.blob in revoked or entry.blob in seen:
                continue
            key = entry.key()
            if key is not None:
                seen.add(entry.blob)
                keys.append(key)
        return keys

    def verdict(self, name: str, key: paramiko.PKey) -> KeyVerdict:
        """What OpenSSH's ``check_host_key`` decides for ``key`` offered by ``name``.

        Revoked for ``name`` -> "revoked". Equal to a pinned key of its type ->
        "pinned"; a different key of that type -> "changed". Nothing of its type pinned
        under ``[host]:port`` (off port 22): OpenSSH checks again "without port
        identifier" and accepts the key when it is pinned, unrevoked, under the bare
        ``host``. Otherwise a key of another type pinned -> "changed" (fleet does not
        quietly add a second identity), nothing at all -> "unknown"."""
        if self.is_revoked(name, key):
            return KeyVerdict("revoked")
        pinned = self.keys_for(name)
        same_type = [k for k in pinned if k.get_name() == key.get_name()]
        blob = key.asbytes()
        if any(k.asbytes() == blob for k in same_type):
            return KeyVerdict("pinned", key)
        if same_type:
            return KeyVerdict("changed", same_type[0])
        bare = _bare_host(name)
        if (
            bare is not None
            and not self.is_revoked(bare, key)
            and any(k.asbytes() == blob for k in self.keys_for(bare))
        ):
            return KeyVerdict("pinned", key)
        if pinned:
            return KeyVerdict("changed", pinned[0])
        return KeyVerdict("unknown")

    def lookup(self, name: str) -> dict[str, paramiko.PKey] | None:
        """Like ``paramiko.HostKeys.lookup``: key type -> key (the first pinned of each
        type, file order), or None when nothing is pinned for ``name``."""
        out: dict[str, paramiko.PKey] = {}
        for key in self.keys_for(name):
            out.setdefault(key.get_name(), key)
        return out or None


# -- reading --------------------------------------------------------------------------------


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _not_regular(path: Path | str, mode: int) -> KnownHostsError:
    return KnownHostsError(
        f"known_hosts {path} is {_kind(mode)}, not a regular file; "
        "give the host variable 'known_hosts' a regular file"
    )


def _too_large(path: Path | str) -> KnownHostsError:
    return KnownHostsError(
        f"known_hosts {path} is larger than {MAX_KNOWN_HOSTS_BYTES // (1024 * 1024)} MiB; "
        "refusing to read it"
    )


def _os_problem(path: Path | str, what: str, exc: OSError) -> KnownHostsError:
    return KnownHostsError(f"cannot {what} known_hosts {path}: {exc.strerror or exc}")


def _read_fd(fd: int, path: Path | str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > MAX_KNOWN_HOSTS_BYTES:
            raise _too_large(path)
        chunks.append(chunk)


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


def read_known_hosts(path: Path) -> tuple[bytes, tuple[int, ...]]:
    """The bytes of a regular known_hosts file (b"" when it does not exist) and its
    identity (device, inode, size, times) for caching. Never blocks on a special file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return b"", ()
    except OSError as exc:
        raise _os_problem(path, "read", exc) from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    if st.st_size > MAX_KNOWN_HOSTS_BYTES:
        raise _too_large(path)
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return b"", ()
    except OSError as exc:
        raise _os_problem(path, "read", exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped after the first look
            raise _not_regular(path, st.st_mode)
        data = _read_fd(fd, path)
    except OSError as exc:
        raise _os_problem(path, "read", exc) from None
    finally:
        os.close(fd)
    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return data, ident


def load_known_hosts(path: Path) -> KnownHosts:
    """Parse ``path`` (cached while the file is unchanged). Raises
    :class:`KnownHostsError` (one line) when the file cannot be used."""
    data, ident = read_known_hosts(path)
    key = str(path)
    if ident:
        with _cache_lock:
            hit = _cache.get(key)
            if hit is not None and hit[0] == ident:
                return hit[1]
    known = KnownHosts.parse(data, key)
    if ident:
        with _cache_lock:
            if len(_cache) >= _CACHE_SIZE:
                _cache.pop(next(iter(_cache)))
            _cache[key] = (ident, known)
    return known


# -- checking -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyCheck:
    status: TrustStatus
    key_type: str
    fingerprint: str
    pinned_fingerprint: str | None = None


def revoked_error(label: str, hostname: str, key: paramiko.PKey, path: Path | str) -> HostKeyError:
    return HostKeyError(
        label,
        f"host key of {hostname} ({key.get_name()} {fingerprint(key)}) is REVOKED in "
        f"{path}; refusing to connect",
        hint="the key is marked @revoked: the host must get a new key before it is trusted",
    )


def _judge(known: KnownHosts, name: str, key: paramiko.PKey, path: Path | str) -> KeyCheck:
    verdict = known.verdict(name, key)
    if verdict.status == "revoked":
        raise revoked_error(name, name, key, path)
    pinned_fp = fingerprint(verdict.pinned) if verdict.pinned is not None else None
    return KeyCheck(verdict.status, key.get_name(), fingerprint(key), pinned_fp)


def check_key(path: Path, name: str, key: paramiko.PKey) -> KeyCheck:
    """Compare a server key with the pinned keys (pure apart from reading the file).

    Raises :class:`HostKeyError` when the key is ``@revoked`` for ``name`` and
    :class:`KnownHostsError` when the file cannot be used."""
    return _judge(load_known_hosts(path), name, key, path)


# -- writing --------------------------------------------------------------------------------

_WRITE_FLAGS = (
    os.O_RDWR
    | os.O_APPEND
    | os.O_CREAT
    | os.O_NOFOLLOW
    | os.O_NONBLOCK
    | os.O_CLOEXEC
    | getattr(os, "O_NOCTTY", 0)
)


def _open_for_update(path: Path) -> int:
    """An fd on the regular file behind ``path`` (created 0600 if missing), opened for
    appending. A symlink is followed to its target; anything else is refused."""
    target = Path(os.path.realpath(path))
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _os_problem(path, "write", exc) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode)
    if st is None and not target.parent.exists():
        if target != Path(os.path.abspath(path)):  # a dangling link into nowhere
            raise KnownHostsError(
                f"cannot write known_hosts {path}: its link target's directory "
                f"{target.parent} does not exist"
            )
        try:
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_problem(path, "write", exc) from None
    try:
        fd = os.open(target, _WRITE_FLAGS, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise KnownHostsError(
                f"cannot write known_hosts {path}: it changed into a symlink while writing"
            ) from None
        raise _os_problem(path, "write", exc) from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise _os_problem(path, "write", exc) from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _not_regular(path, st.st_mode)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def pin_key(path: Path, name: str, key: paramiko.PKey) -> None:
    """Append ``name keytype base64`` to known_hosts, as OpenSSH does.

    The update holds an exclusive ``flock`` on the file from reading to writing, so two
    concurrent runs both land their keys. A key already pinned (by a concurrent run) is
    not added twice; a *different* key pinned meanwhile is refused (accept-new never
    replaces a key). A symlink is written through; a FIFO, device or directory is refused.
    """
    if not _PINNABLE_RE.match(name) or len(name) > 1024:
        raise UsageError(f"refusing to pin a key under the name {name[:80]!r}")
    if key.get_name() not in KEY_TYPES:
        raise UsageError(f"{name}: cannot pin a key of type {key.get_name()!r}")
    line = f"{name} {key.get_name()} {key.get_base64()}\n".encode()
    with _write_lock:
        fd = _open_for_update(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                data = _read_fd(fd, path)
            except OSError as exc:
                raise _os_problem(path, "read", exc) from None
            check = _judge(KnownHosts.parse(data, str(path)), name, key, path)
            if check.status == "pinned":
                return
            if check.status == "changed":
                raise HostKeyError(
                    name,
                    f"a different key was pinned for {name} in {path} meanwhile "
                    f"({check.pinned_fingerprint}); not replaced",
                )
            prefix = b"\n" if data and not data.endswith(b"\n") else b""
            try:
                _write_all(fd, prefix + line)
                os.fsync(fd)
            except OSError as exc:
                raise _os_problem(path, "write", exc) from None
        finally:
            os.close(fd)  # releases the lock


# -- paramiko -------------------------------------------------------------------------------


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"host key for {hostname} is not pinned")
        self.hostname = hostname
        self.key = key


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    """Never accept a key silently (paramiko's default in Fabric is AutoAddPolicy).

    paramiko calls this when nothing is pinned under the host's name: the key is still
    accepted when OpenSSH would (pinned under the bare host off port 22), refused as
    revoked when it is ``@revoked``, and refused as unknown otherwise."""

    def __init__(self, known: KnownHosts | None = None, label: str = "") -> None:
        self.known = known
        self.label = label

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if self.known is not None:
            status = self.known.verdict(hostname, key).status
            if status == "pinned":
                return
            if status == "revoked":
                raise revoked_error(self.label or hostname, hostname, key, self.known.path)
        raise UnknownHostKey(hostname, key)


class _Judged:
    """Stands for the pinned keys in paramiko's comparison ``our_key != server_key``, and
    answers with :meth:`KnownHosts.verdict`: any pinned line of the type may match (as in
    OpenSSH), and a revoked key is refused as revoked. Attribute access (fingerprints in
    BadHostKeyException) goes to the pinned key shown as the expected one."""

    def __init__(self, known: KnownHosts, hostname: str, label: str, shown: paramiko.PKey):
        self._known = known
        self._hostname = hostname
        self._label = label
        self._shown = shown

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, paramiko.PKey):
            return NotImplemented
        status = self._known.verdict(self._hostname, other).status
        if status == "revoked":
            raise revoked_error(self._label or self._hostname, self._hostname, other, "")
        return status == "pinned"

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shown, name)


class _PinnedKeys(dict[str, Any]):
    """What paramiko's client expects from ``HostKeys.get(name)``: ``keys()[0]`` is the
    preferred key type (paramiko asks the server for it first), ``get(type)`` stands for
    the pinned keys (of any type: the verdict decides)."""

    def __init__(self, types: list[str], judged: Callable[[str], _Judged]) -> None:
        super().__init__({t: None for t in types})
        self._judged = judged

    def keys(self) -> list[str]:  # type: ignore[override]
        return list(super().keys())

    def get(self, key_type: str, default: Any = None) -> Any:
        return self._judged(key_type)

    def values(self) -> list[Any]:  # type: ignore[override]
        return [self._judged(t) for t in self.keys()]


class PinnedHostKeys(paramiko.HostKeys):
    """A paramiko ``HostKeys`` answering from :class:`KnownHosts` (OpenSSH matching)."""

    def __init__(self, known: KnownHosts, label: str = "") -> None:
        super().__init__()
        self.known = known
        self.label = label

    def lookup(self, hostname: str) -> Any:
        pinned = self.known.keys_for(hostname)
        if not pinned:
            return None  # the policy decides (bare-host fallback, revoked, unknown)
        types = list(dict.fromkeys(k.get_name() for k in pinned))

        def judged(key_type: str) -> _Judged:
            shown = next((k for k in pinned if k.get_name() == key_type), pinned[0])
            return _Judged(self.known, hostname, self.label, shown)

        return _PinnedKeys(types, judged)


def strict_client(client: paramiko.SSHClient, known_hosts: Path, label: str = "") -> None:
    """Hold ``client`` to the keys pinned in ``known_hosts``: unknown keys refused
    (:class:`UnknownHostKey`), changed keys refused (paramiko's BadHostKeyException),
    revoked keys refused (:class:`HostKeyError`)."""
    known = load_known_hosts(known_hosts)
    client.set_missing_host_key_policy(RejectUnknown(known, label))
    client._host_keys = PinnedHostKeys(known, label)  # type: ignore[attr-defined]
    client._host_keys_filename = None  # type: ignore[attr-defined]  # never saved back

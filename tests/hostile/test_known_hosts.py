"""known_hosts corpus: OpenSSH syntax, garbage, special files, large files, and the trust
flow under concurrency, on real sshd hosts where it matters.

- corpus: generated lines (OpenSSH syntax and garbage bytes) around a pinned key never
  break the lookup of that key, and the parser never raises;
- OpenSSH as the oracle: for each known_hosts variant (hashed, wildcards, negation,
  ``@revoked``, ``@cert-authority``, garbage, two keys of a type...), ``fleet ping`` and
  ``ssh -o StrictHostKeyChecking=yes`` must agree on accept or refuse;
- special files: FIFO, devices (made with mknod under a temp dir, never the system's),
  directory, socket, symlinks to them, loops, a file over the size cap: refused at once
  (no hang), never replaced, and regular files behind symlinks written through;
- large files: 200,000 lines looked up within a hang bound;
- two concurrent ``fleet trust --accept-new`` runs never lose a key.
"""

from __future__ import annotations

import base64
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml
from hostile_support import SCALE, Hung, Tally, one_line_error, run_fleet, within
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.errors import FleetError
from fleet.transport.hostkeys import (
    KnownHosts,
    KnownHostsError,
    check_key,
    known_hosts_name,
    pin_key,
)

HANG_SECONDS = 30.0


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, paramiko.PKey]:
    d = tmp_path_factory.mktemp("keys")
    out: dict[str, paramiko.PKey] = {}
    for name, kind in (("a", "ed25519"), ("b", "ed25519"), ("r", "rsa")):
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(d / name)], check=True)
        out[name] = paramiko.PKey.from_path(str(d / name))
    return out


def line(host: str, key: paramiko.PKey, marker: str = "", tail: str = "") -> str:
    head = f"{marker} " if marker else ""
    return f"{head}{host} {key.get_name()} {key.get_base64()}{tail}\n"


# -- corpus -------------------------------------------------------------------------------

FIELDS = st.sampled_from(
    [
        "@cert-authority",
        "@revoked",
        "@revokedx",
        "@",
        "|1|",
        "|1|c2FsdA==|aGFzaA==",
        "|2|x|y",
        "*",
        "!*",
        "[h]:22",
        "h,h2,!h3",
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ssh-dss",
        "sk-ssh-ed25519@openssh.com",
        "ssh-ed25519-cert-v01@openssh.com",
        "AAAAC3NzaC1lZDI1NTE5",
        "AAAA",
        "!!!",
        "#",
        "",
    ]
)
junk_line = st.one_of(
    st.lists(st.one_of(FIELDS, st.text(max_size=12)), max_size=6).map(" ".join),
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ").decode("latin-1")),
)


def test_generated_lines_never_break_a_pinned_key(
    tmp_path: Path, keys: dict[str, paramiko.PKey], tally: Tally
) -> None:
    category = "known_hosts corpus"
    target = "[10.0.0.7]:2200"
    kh = tmp_path / "known_hosts"

    @settings(
        max_examples=300 * SCALE,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(st.lists(junk_line, max_size=8), st.lists(junk_line, max_size=8), st.booleans())
    def one(before: list[str], after: list[str], crlf: bool) -> None:
        end = "\r\n" if crlf else "\n"
        body = end.join([*before, line(target, keys["a"]).strip(), *after]) + end
        data = body.encode("latin-1", "replace")
        kh.write_bytes(data)
        tally.attempt(category)
        try:
            KnownHosts.parse(data)
            status = check_key(kh, target, keys["a"]).status
        except FleetError as exc:  # only a @revoked junk line may refuse the key
            if "REVOKED" not in str(exc):
                tally.bad(category, "wrong exit", f"{exc}: {data[:120]!r}")
            return
        except Exception as exc:
            tally.bad(category, "tracebacks", f"{type(exc).__name__}: {exc}: {data[:120]!r}")
            raise
        if status != "pinned":
            tally.bad(category, "wrong exit", f"{status}: {data[:160]!r}")
        assert status == "pinned", data

    one()
    assert not tally.failures(category), tally.categories[category].examples


def test_large_files_are_read_in_linear_time(
    tmp_path: Path, keys: dict[str, paramiko.PKey], tally: Tally
) -> None:
    category = "known_hosts large files"
    a = keys["a"]
    for n in (20_000, 200_000):
        rows = [line(f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}", a) for i in range(n)]
        rows[n // 2] = "garbage line\n"
        rows.append(line("[target.example]:2222", keys["b"]))
        kh = tmp_path / f"kh-{n}"
        kh.write_text("".join(rows))
        tally.attempt(category)
        try:
            status = within(
                HANG_SECONDS,
                lambda kh=kh: check_key(kh, "[target.example]:2222", keys["b"]).status,
            )
        except Hung as exc:
            tally.bad(category, "hangs", f"{n} lines: {exc}")
            raise
        assert status == "pinned"
    big = tmp_path / "kh-sparse"
    with open(big, "wb") as fh:
        fh.truncate(65 * 1024 * 1024)  # over the cap: refused without being read
    tally.attempt(category)
    with pytest.raises(KnownHostsError, match="larger than"):
        within(HANG_SECONDS, lambda: check_key(big, "h", a))


# -- special files ------------------------------------------------------------------------

SPECIAL = ["fifo", "null-device", "zero-device", "directory", "socket", "symlink-to-fifo"]


def make_special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"kh-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind in ("null-device", "zero-device"):
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3 if "null" in kind else 5))
        except PermissionError:
            pytest.skip("mknod not permitted")
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "symlink-to-fifo":
        os.mkfifo(tmp_path / "fifo-target")
        path.symlink_to(tmp_path / "fifo-target")
    return path


def _identity(path: Path) -> tuple[int, int, int]:
    st_ = os.stat(path)
    return (stat.S_IFMT(st_.st_mode), st_.st_ino, st_.st_size)


@pytest.mark.parametrize("kind", SPECIAL)
def test_special_files_refused_at_once_and_kept(
    tmp_path: Path, kind: str, keys: dict[str, paramiko.PKey], tally: Tally
) -> None:
    category = "known_hosts special files"
    path = make_special(tmp_path, kind)
    before = _identity(path)
    for what, fn in (
        ("check", lambda: check_key(path, "h1", keys["a"])),
        ("pin", lambda: pin_key(path, "h1", keys["a"])),
    ):
        tally.attempt(category)
        try:
            within(HANG_SECONDS, fn)
        except KnownHostsError as exc:
            assert "\n" not in str(exc) and "not a regular file" in str(exc)
        except Hung as exc:
            tally.bad(category, "hangs", f"{kind} {what}: {exc}")
            raise
        except Exception as exc:
            tally.bad(category, "tracebacks", f"{kind} {what}: {type(exc).__name__}: {exc}")
            raise
        else:
            tally.bad(category, "wrong exit", f"{kind} {what}: accepted")
            pytest.fail(f"{kind}: {what} accepted a special file")
        if _identity(path) != before or (kind.startswith("symlink") and not path.is_symlink()):
            tally.bad(category, "data loss", f"{kind} {what}: the file was replaced")
        assert _identity(path) == before


def test_symlinks_loops_and_dangling_links(
    tmp_path: Path, keys: dict[str, paramiko.PKey], tally: Tally
) -> None:
    category = "known_hosts special files"
    real = tmp_path / "real"
    real.write_text(line("h0", keys["b"]))
    link = tmp_path / "link"
    link.symlink_to(real)
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "new-target")

    tally.attempt(category, 4)
    pin_key(link, "h1", keys["a"])
    assert link.is_symlink() and real.read_text() == line("h0", keys["b"]) + line("h1", keys["a"])
    with pytest.raises(KnownHostsError) as err:
        pin_key(loop, "h1", keys["a"])
    assert "\n" not in str(err.value)
    assert loop.is_symlink()
    with pytest.raises(KnownHostsError):
        check_key(loop, "h1", keys["a"])
    assert check_key(dangling, "h1", keys["a"]).status == "unknown"
    pin_key(dangling, "h1", keys["a"])
    assert dangling.is_symlink() and "h1 " in (tmp_path / "new-target").read_text()


UNWRITABLE = r"""
import os, sys
from pathlib import Path
import paramiko
from fleet.errors import FleetError
from fleet.transport.hostkeys import pin_key
key = paramiko.PKey.from_path(sys.argv[2])
os.setgid(65534)
os.setuid(65534)
try:
    pin_key(Path(sys.argv[1]), "h1", key)
except FleetError as exc:
    print(f"fleet: error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
"""


def test_unwritable_directory_is_one_line(tmp_path: Path, tally: Tally) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to drop to an unprivileged user")
    category = "known_hosts special files"
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    keyfile = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keyfile)], check=True)
    keyfile.chmod(0o644)
    tally.attempt(category)
    proc = subprocess.run(
        [sys.executable, "-c", UNWRITABLE, str(locked / "known_hosts"), str(keyfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "Traceback" in proc.stderr:
        tally.bad(category, "tracebacks", proc.stderr[-300:])
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "cannot write known_hosts" in proc.stderr and "Permission denied" in proc.stderr


# -- against OpenSSH and real hosts --------------------------------------------------------


def _hashed(name: str) -> str:
    import hashlib
    import hmac

    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def variants(name: str, real: paramiko.PKey, keys: dict[str, paramiko.PKey]) -> dict[str, bytes]:
    """known_hosts contents around the host's real key ``real`` (filed under ``name``)."""
    host, port = name[1:].split("]:")
    other, rsa = keys["b"], keys["r"]
    junk = "garbage\n@bogus x y z\nh ssh-ed25519 !!!notbase64\n\n# comment\n"
    text = {
        "plain": line(name, real),
        "hashed": line(_hashed(name), real),
        "wildcard host": line(f"[{host[:-1]}*]:{port}", real),
        "wildcard port": line(f"[{host}]:*", real),
        "question mark": line(f"[{host[:-1]}?]:{port}", real),
        "negated": line(f"*,!{name}", real),
        "listed with others": line(f"a.example,{name},b.example", real),
        "revoked": line(name, real) + line("*", real, "@revoked"),
        "revoked hashed": line(name, real) + line(_hashed(name), real, "@revoked"),
        "revoked other key": line(name, real) + line("*", other, "@revoked"),
        "cert-authority only": line("*", real, "@cert-authority"),
        "bad marker": line("*", real, "@revokedx") + line(name, real),
        "wrong key": line(name, other),
        "two keys one type": line(name, other) + line(name, real),
        "other type only": line(name, rsa),
        "garbage around": junk + line(name, real) + junk,
        "bad base64 first": f"{name} ssh-ed25519 AAAA!!\n" + line(name, real),
        "leading whitespace": "  \t" + line(name, real),
        "trailing comment": line(name, real, tail=" root@somewhere"),
        "commented out": "#" + line(name, real),
        "port-less name": line(host, real),
        "empty": "",
    }
    out = {k: v.encode() for k, v in text.items()}
    out["non-UTF-8 comment"] = line(name, real, tail=" c\xff").encode("latin-1")
    out["non-UTF-8 junk"] = b"\xff\xfe\x80 x y\n" + line(name, real).encode()
    out["CRLF"] = line(name, real).replace("\n", "\r\n").encode()
    return out


def _ssh_accepts(box: Any, host: Any, user: str, kh: Path) -> bool:
    cmd = [
        "ssh", "-F", "none", "-p", str(host.port), "-i", str(box.client_key_path),
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={kh}", "-o", "GlobalKnownHostsFile=none",
        "-o", "UpdateHostKeys=no", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10",
        "-o", "LogLevel=ERROR", f"{user}@{host.address}", "true",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode == 0


@pytest.mark.integration
@pytest.mark.sandbox(hosts=1, vllm=("0.17.0",))
def test_fleet_and_openssh_agree_on_every_variant(
    sandbox: Any, keys: dict[str, paramiko.PKey], tally: Tally
) -> None:
    from fleet.inventory import load_inventory

    category = "known_hosts vs OpenSSH"
    (host,) = sandbox.hosts
    spec = load_inventory(sandbox.inventory_path).hosts[host.name]
    name = known_hosts_name(host.address, host.port)
    pinned = KnownHosts.parse(sandbox.known_hosts_path.read_bytes())
    (real,) = pinned.keys_for(name)
    kh = sandbox.known_hosts_path
    disagree = []
    for label, data in variants(name, real, keys).items():
        kh.write_bytes(data)
        tally.attempt(category)
        openssh = _ssh_accepts(sandbox, host, spec.user or "root", kh)
        run = run_fleet(["--inventory", str(sandbox.inventory_path), "ping", "--host", host.name])
        if run.traceback:
            tally.bad(category, "tracebacks", f"{label}: {run.trace or run.stderr[-200:]}")
        fleet_ok = run.code == 0
        if run.code not in (0, 3):
            tally.bad(category, "wrong exit", f"{label}: exit {run.code}: {run.stdout[-200:]}")
        if fleet_ok != openssh:
            tally.bad(category, "wrong exit", f"{label}: fleet {fleet_ok}, OpenSSH {openssh}")
            disagree.append(label)
        if label in ("revoked", "revoked hashed") and "REVOKED" not in run.stdout:
            tally.bad(category, "wrong exit", f"{label}: not refused as revoked: {run.stdout}")
            disagree.append(label)
    assert not disagree


def _inventory_with(box: Any, tmp_path: Path, known_hosts: Path) -> Path:
    doc = yaml.safe_load(box.inventory_path.read_text())
    doc["all"]["vars"]["known_hosts"] = str(known_hosts)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(doc))
    return inv


def _trust(inv: Path, host: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fleet", "--inventory", str(inv), "trust", "--host", host,
         "--accept-new", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.integration
@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",), pinned=False)
def test_two_concurrent_trusts_never_lose_a_key(sandbox: Any, tmp_path: Path, tally: Tally) -> None:
    category = "trust concurrency"
    first, second = sandbox.hosts
    target = tmp_path / "store" / "known_hosts"
    target.parent.mkdir()
    link = tmp_path / "known_hosts"
    link.symlink_to(target)
    plain_inv = sandbox.inventory_path
    link_inv = _inventory_with(sandbox, tmp_path, link)
    names = [known_hosts_name(h.address, h.port) for h in (first, second)]
    lost = 0
    rounds = 4 * SCALE  # even: the last round pins through the symlink
    for i in range(rounds):
        inv, kh = (plain_inv, sandbox.known_hosts_path) if i % 2 == 0 else (link_inv, target)
        kh.write_text("")
        procs = [_trust(inv, first.name), _trust(inv, second.name)]
        results = [p.communicate(timeout=120) for p in procs]
        tally.attempt(category)
        for proc, (_out, err) in zip(procs, results, strict=True):
            if "Traceback" in err:
                tally.bad(category, "tracebacks", err[-300:])
            if proc.returncode != 0:
                tally.bad(category, "wrong exit", f"exit {proc.returncode}: {err[-200:]}")
        text = kh.read_text()
        missing = [n for n in names if f"{n} ssh-" not in text]
        if missing:
            lost += 1
            tally.bad(category, "data loss", f"round {i}: lost {missing}")
        if i % 2 == 1 and not link.is_symlink():
            tally.bad(category, "data loss", "the symlink was replaced by a file")
    assert lost == 0 and link.is_symlink()
    assert not tally.failures(category), tally.categories[category].examples
    # the keys pinned by the last round (through the symlink) are the hosts' real keys
    assert run_fleet(["--inventory", str(link_inv), "ping", "--host", "all"]).code == 0


@pytest.mark.integration
@pytest.mark.sandbox(hosts=1, vllm=("0.17.0",), pinned=False)
def test_fifo_known_hosts_never_hangs_trust_or_ping(
    sandbox: Any, tmp_path: Path, tally: Tally
) -> None:
    category = "known_hosts special files"
    fifo = tmp_path / "known_hosts"
    os.mkfifo(fifo)
    inv = _inventory_with(sandbox, tmp_path, fifo)
    for args, expected in ((["trust", "--accept-new"], 2), (["ping"], None)):
        tally.attempt(category)
        try:
            run = within(
                HANG_SECONDS,
                lambda args=args: run_fleet(["--inventory", str(inv), *args, "--host", "all"]),
            )
        except Hung as exc:
            tally.bad(category, "hangs", f"{args}: {exc}")
            raise
        if run.traceback:
            tally.bad(category, "tracebacks", f"{args}: {run.trace or run.stderr[-200:]}")
        assert not run.traceback
        assert run.code != 0
        if expected is not None:
            assert run.code == expected and one_line_error(run), run.stderr
        assert "not a regular file" in run.stdout + run.stderr
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)

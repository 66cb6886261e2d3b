"""Pure parts of the transport: host-key files, fault classification, the parallel map."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import paramiko
import pytest

from fleet.errors import ConnectError, OperationFailed
from fleet.inventory import HostSpec
from fleet.transport import exit_code, map_hosts
from fleet.transport.connection import _is_transient
from fleet.transport.hostkeys import check_key, fingerprint, known_hosts_name, pin_key
from fleet.transport.session import Session


def _key() -> paramiko.PKey:
    return paramiko.Ed25519Key.from_private_key_file(str(_KEYFILE))


_KEYFILE: Path


@pytest.fixture(autouse=True, scope="module")
def _keyfile(tmp_path_factory: pytest.TempPathFactory) -> None:
    global _KEYFILE
    d = tmp_path_factory.mktemp("keys")
    for name in ("a", "b"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True
        )
    _KEYFILE = d / "a"


def test_pin_then_check(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    key = paramiko.Ed25519Key.from_private_key_file(str(_KEYFILE))
    other = paramiko.Ed25519Key.from_private_key_file(str(_KEYFILE.parent / "b"))
    name = known_hosts_name("127.0.0.9", 2200)
    assert name == "[127.0.0.9]:2200"
    assert known_hosts_name("10.0.0.1", 22) == "10.0.0.1"
    assert check_key(kh, name, key).status == "unknown"
    pin_key(kh, name, key)
    assert check_key(kh, name, key).status == "pinned"
    changed = check_key(kh, name, other)
    assert changed.status == "changed"
    assert changed.pinned_fingerprint == fingerprint(key) != changed.fingerprint
    # the file is what ssh-keygen understands: OpenSSH itself finds the key
    found = subprocess.run(
        ["ssh-keygen", "-F", name, "-f", str(kh)], capture_output=True, text=True
    )
    assert found.returncode == 0 and key.get_base64() in found.stdout
    assert oct(kh.stat().st_mode & 0o777) == "0o600"


def test_fingerprint_matches_ssh_keygen() -> None:
    key = paramiko.Ed25519Key.from_private_key_file(str(_KEYFILE))
    out = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(_KEYFILE) + ".pub"], capture_output=True, text=True
    )
    assert fingerprint(key) == out.stdout.split()[1]


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (
            paramiko.ssh_exception.NoValidConnectionsError({("127.0.0.1", 22): OSError("refused")}),
            True,
        ),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (EOFError(), True),
        (paramiko.SSHException("Error reading SSH protocol banner"), True),
        (paramiko.AuthenticationException("nope"), False),
        (socket.gaierror(-2, "Name or service not known"), False),
    ],
)
def test_transient_classification(exc: BaseException, transient: bool) -> None:
    assert _is_transient(exc) is transient


def test_host_key_failures_are_not_retried() -> None:
    key = paramiko.Ed25519Key.from_private_key_file(str(_KEYFILE))
    other = paramiko.Ed25519Key.from_private_key_file(str(_KEYFILE.parent / "b"))
    from fleet.transport.hostkeys import UnknownHostKey

    assert _is_transient(paramiko.BadHostKeyException("h", key, other)) is False
    assert _is_transient(UnknownHostKey("h", key)) is False


def test_jump_spec_parsing() -> None:
    session = Session()
    host = HostSpec(
        name="gpu1",
        address="10.1.1.1",
        jump="ops@bastion.example:2222",
        ssh_key="/k",
        known_hosts="/kh",
    )
    jump = session.jump_spec(host)
    assert jump is not None
    assert (jump.address, jump.port, jump.user, jump.ssh_key, jump.known_hosts) == (
        "bastion.example",
        2222,
        "ops",
        "/k",
        "/kh",
    )
    assert session.jump_spec(HostSpec(name="x")) is None


def test_map_hosts_bounds_parallelism_and_keeps_order() -> None:
    hosts = [HostSpec(name=f"h{i:02d}") for i in range(20)]
    lock = threading.Lock()
    active = peak = 0
    four_in_flight = threading.Event()

    def work(host: HostSpec) -> str:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            if host.name == "h03":
                raise ConnectError(host.name, "cannot connect: connection refused")
            if host.name == "h07":
                raise OperationFailed("h07: disk full")
            if host.name == "h08":
                raise ValueError("bug")
            # The first workers wait until four are in flight at once: only possible if the
            # map really runs --forks of them in parallel (a serial map never gets there).
            with lock:
                if active == 4:
                    four_in_flight.set()
            four_in_flight.wait(timeout=10)
            return host.name.upper()
        finally:
            with lock:
                active -= 1

    outcomes = map_hosts(hosts, work, forks=4)
    assert [o.host for o in outcomes] == [h.name for h in hosts]
    assert peak == 4  # parallel, and never more than --forks
    by = {o.host: o for o in outcomes}
    assert by["h03"].status == "unreachable" and "refused" in (by["h03"].error or "")
    assert by["h07"].status == "failed" and by["h07"].error == "disk full"
    assert by["h08"].status == "failed" and "ValueError" in (by["h08"].error or "")
    assert by["h08"].code == "internal-error" and isinstance(by["h08"].exc, ValueError)
    assert by["h00"].value == "H00"
    assert exit_code(outcomes) == 3
    assert exit_code([o for o in outcomes if o.host != "h03"]) == 1
    assert exit_code([by["h00"]]) == 0


# The kernel may hand a process's SIGINT to any thread that does not block it; Python runs
# the handler in the main thread only. Here only a worker can receive it: the map must still
# stop at once, not when a host finishes.
CTRL_C_IN_A_WORKER = """
import os, signal, sys, threading, time
from fleet.inventory import HostSpec
from fleet.transport import map_hosts

def main_thread_state():
    with open(f"/proc/self/task/{threading.main_thread().native_id}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]

def work(host):
    if host.name == "h0":
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        while main_thread_state() != "S":  # until the main thread waits for the workers
            time.sleep(0.01)
        time.sleep(0.1)
        print("running", flush=True)
    time.sleep(60)

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # the workers inherit the mask
try:
    map_hosts([HostSpec(name=f"h{i}") for i in range(3)], work)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    os._exit(130)  # the sleeping workers are not waited for
"""


def test_ctrl_c_that_lands_in_a_worker_thread_stops_the_map() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_IN_A_WORKER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=10)  # the workers would sleep for 60 s
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and "interrupted" in out


def test_failure_lines_escape_markup() -> None:
    from rich.console import Console

    from fleet.cli import render
    from fleet.transport import HostOutcome

    out = Console(record=True, width=200, force_terminal=False)
    render.host_table(
        out,
        [HostOutcome("[/x]", "unreachable", error="[bold]boom[/bold] at [/]", hint="[/red]")],
        ["col"],
        lambda v: [str(v)],
    )
    text = out.export_text()
    assert "[/x]: [bold]boom[/bold] at [/]" in text
    assert "next: [/red]" in text


# -- known_hosts: OpenSSH semantics, special files, locking --------------------------------


def _pub(name: str = "a") -> paramiko.PKey:
    return paramiko.Ed25519Key.from_private_key_file(str(_KEYFILE.parent / name))


def _line(host: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker + ' ' if marker else ''}{host} {key.get_name()} {key.get_base64()}\n"


def _hashed(host: str, salt: bytes = b"s" * 20) -> str:
    import base64
    import hashlib
    import hmac

    digest = hmac.new(salt, host.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_lines_openssh_skips_do_not_break_the_others(tmp_path: Path) -> None:
    key = _pub()
    junk = [
        b"# a comment\n",
        b"\n",
        b"   \t  \n",
        b"garbage\n",
        b"@bogus-marker h ssh-ed25519 AAAA\n",
        b"h ssh-ed25519 not!base64\n",
        b"h ssh-dss AAAAB3NzaC1kc3MAAACBAP\n",
        b"h sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t\n",
        b"h ssh-rsa " + key.get_base64().encode() + b"\n",  # blob of another type
        b"\xff\xfe\x00 binary \x80\n",
        b"h\n",
        b"h ssh-ed25519\n",
        b"@cert-authority *.example " + _line("", key).strip().encode() + b"\n",
    ]
    kh = tmp_path / "known_hosts"
    kh.write_bytes(b"".join(junk) + _line("[10.0.0.5]:2200", key).encode())
    assert check_key(kh, "[10.0.0.5]:2200", key).status == "pinned"
    assert check_key(kh, "10.0.0.6", key).status == "unknown"
    from fleet.transport.hostkeys import load_known_hosts

    known = load_known_hosts(kh)
    assert len(known.entries) == 1 and len(known.cert_authorities) == 1
    assert known.skipped == 9  # every line above but the comment, blanks and the CA


def test_hashed_wildcard_and_negated_hosts_match_like_openssh(tmp_path: Path) -> None:
    key = _pub()
    kh = tmp_path / "known_hosts"
    kh.write_text(
        _line(_hashed("[10.0.0.5]:2200"), key)
        + _line("*.gpu.example,!bad.gpu.example", key)
        + _line("rack?-*", key)
    )
    for name in ("[10.0.0.5]:2200", "b200.gpu.example", "B200.GPU.example", "rack1-b200"):
        assert check_key(kh, name, key).status == "pinned", name
    for name in ("[10.0.0.5]:2201", "bad.gpu.example", "gpu.example", "rack12-x"):
        assert check_key(kh, name, key).status == "unknown", name
    # ssh-keygen -H writes the same hashes fleet matches
    plain = tmp_path / "plain"
    plain.write_text(_line("[10.0.0.9]:22", key) + _line("10.0.0.8", key))
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(plain)], check=True, capture_output=True)
    assert "10.0.0.8" not in plain.read_text()
    assert check_key(plain, "10.0.0.8", key).status == "pinned"


def test_revoked_key_is_refused_even_when_pinned(tmp_path: Path) -> None:
    from fleet.errors import HostKeyError

    key, other = _pub("a"), _pub("b")
    kh = tmp_path / "known_hosts"
    kh.write_text(_line("h1", key) + _line("*", key, "@revoked") + _line("h2", other))
    with pytest.raises(HostKeyError, match=r"REVOKED"):
        check_key(kh, "h1", key)
    assert check_key(kh, "h2", other).status == "pinned"  # another key: not revoked
    with pytest.raises(HostKeyError, match="REVOKED"):
        pin_key(kh, "h3", key)
    assert "h3" not in kh.read_text()


def test_several_keys_of_one_type_any_matches(tmp_path: Path) -> None:
    key, other = _pub("a"), _pub("b")
    kh = tmp_path / "known_hosts"
    kh.write_text(_line("h1", other) + _line("h1", key))
    assert check_key(kh, "h1", key).status == "pinned"
    assert check_key(kh, "h1", other).status == "pinned"


def _special(tmp_path: Path, kind: str) -> Path:
    import os
    import stat

    path = tmp_path / f"kh-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind in ("null-device", "zero-device"):
        minor = 3 if kind == "null-device" else 5
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        except PermissionError:
            pytest.skip("mknod not permitted")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    return path


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "directory", "null-device", "zero-device", "socket"])
def test_special_files_are_refused_not_read_or_replaced(tmp_path: Path, kind: str) -> None:
    import os
    import stat

    from fleet.transport.hostkeys import KnownHostsError

    path = _special(tmp_path, kind)
    before = os.lstat(path)
    with pytest.raises(KnownHostsError, match="not a regular file") as err:
        check_key(path, "h1", _pub())
    assert "\n" not in str(err.value)
    with pytest.raises(KnownHostsError, match="not a regular file"):
        pin_key(path, "h1", _pub())
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(KnownHostsError, match="not a regular file"):
        pin_key(link, "h1", _pub())
    after = os.lstat(path)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    assert link.is_symlink()


def test_pin_writes_through_a_symlink(tmp_path: Path) -> None:
    key = _pub()
    target = tmp_path / "real" / "known_hosts"
    target.parent.mkdir()
    target.write_text("# kept\n" + _line("h0", _pub("b")).rstrip("\n"))  # no final newline
    target.chmod(0o644)
    link = tmp_path / "known_hosts"
    link.symlink_to(target)
    pin_key(link, "h1", key)
    assert link.is_symlink()
    assert target.read_text().splitlines() == [
        "# kept",
        _line("h0", _pub("b")).strip(),
        _line("h1", key).strip(),
    ]
    assert oct(target.stat().st_mode & 0o777) == "0o644"  # mode kept
    pin_key(link, "h1", key)  # already pinned: not written twice
    assert target.read_text().count("h1 ") == 1
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "created-here")
    pin_key(dangling, "h2", key)
    assert dangling.is_symlink() and "h2 " in (tmp_path / "created-here").read_text()


def test_unwritable_places_are_one_line(tmp_path: Path) -> None:
    from fleet.transport.hostkeys import KnownHostsError

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(KnownHostsError, match="cannot write known_hosts") as err:
        pin_key(not_a_dir / "known_hosts", "h1", _pub())
    assert "\n" not in str(err.value)
    nowhere = tmp_path / "link"
    nowhere.symlink_to(tmp_path / "missing-dir" / "kh")
    with pytest.raises(KnownHostsError, match="does not exist"):
        pin_key(nowhere, "h1", _pub())


def test_names_that_would_add_lines_or_patterns_are_not_pinned(tmp_path: Path) -> None:
    from fleet.errors import UsageError

    kh = tmp_path / "known_hosts"
    for name in ("h1\n* ssh-ed25519 AAAA", "*", "h1,h2", "!h", "@revoked", "#x", "a b", ""):
        with pytest.raises(UsageError, match="refusing to pin"):
            pin_key(kh, name, _pub())
    assert not kh.exists() or kh.read_text() == ""


def _pin_many(path: str, keyfile: str, names: list[str]) -> None:
    key = paramiko.Ed25519Key.from_private_key_file(keyfile)
    for name in names:
        pin_key(Path(path), name, key)


def test_concurrent_pins_from_processes_lose_nothing(tmp_path: Path) -> None:
    import multiprocessing

    kh = tmp_path / "known_hosts"
    ctx = multiprocessing.get_context("fork")
    groups = [[f"p{p}-h{i}" for i in range(40)] for p in range(3)]
    procs = [
        ctx.Process(target=_pin_many, args=(str(kh), str(_KEYFILE), names)) for names in groups
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    lines = kh.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines) == sorted(n for g in groups for n in g)


def test_off_port_22_the_bare_host_is_checked_too(tmp_path: Path) -> None:
    # OpenSSH: nothing of the key's type under [host]:port -> "checking without port
    # identifier"; only an exact, unrevoked match there is accepted
    key, other = _pub("a"), _pub("b")
    kh = tmp_path / "known_hosts"
    kh.write_text(_line("10.0.0.5", key))
    assert check_key(kh, "[10.0.0.5]:2200", key).status == "pinned"
    assert check_key(kh, "[10.0.0.5]:2200", other).status == "unknown"
    kh.write_text(_line("[10.0.0.5]:2200", other) + _line("10.0.0.5", key))
    assert check_key(kh, "[10.0.0.5]:2200", key).status == "changed"  # the port's key wins
    kh.write_text(_line("10.0.0.5", key) + _line("10.0.0.5", key, "@revoked"))
    assert check_key(kh, "[10.0.0.5]:2200", key).status == "unknown"

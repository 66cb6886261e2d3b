"""Pure parts of the transport: host-key files, fault classification, the parallel map."""

from __future__ import annotations

import socket
import subprocess
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

"""The cheap paths of fleet.transport: paramiko without Invoke, a host that ssh_config
leaves alone reached without Fabric, retries that import tenacity only when needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from fleet.inventory import HostSpec
from fleet.transport import connection
from fleet.transport.connection import ConnectOptions, DirectConnection, configured_connection


def _spec(tmp_path: Path, **extra: object) -> HostSpec:
    kh = tmp_path / "known_hosts"
    kh.touch()
    fields: dict[str, object] = {"name": "h1", "address": "10.9.9.9", "known_hosts": str(kh)}
    fields.update(extra)
    return HostSpec(**fields)  # type: ignore[arg-type]


def _options(tmp_path: Path, text: str) -> ConnectOptions:
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return ConnectOptions(ssh_config_path=str(path))


def test_a_host_ssh_config_leaves_alone_gets_paramiko_alone(tmp_path: Path) -> None:
    opts = _options(tmp_path, "Host other\n  IdentityFile /nope\nHost h*\n  SendEnv LANG\n")
    conn = configured_connection(_spec(tmp_path, address="h1", user="bob", port=2200), opts)
    assert isinstance(conn, DirectConnection)
    assert (conn.host, conn.port, conn.user) == ("h1", 2200, "bob")


def test_ssh_config_hostname_user_and_port_are_honoured(tmp_path: Path) -> None:
    opts = _options(tmp_path, "Host alias\n  HostName 10.1.2.3\n  User carol\n  Port 2022\n")
    conn = configured_connection(_spec(tmp_path, address="alias"), opts)
    assert isinstance(conn, DirectConnection)
    assert (conn.host, conn.port, conn.user) == ("10.1.2.3", 2022, "carol")


@pytest.mark.parametrize(
    "line",
    ["IdentityFile ~/.ssh/other", "ProxyJump gw", "ProxyCommand nc %h %p", "ForwardAgent yes"],
)
def test_what_only_fabric_handles_goes_to_fabric(tmp_path: Path, line: str) -> None:
    opts = _options(tmp_path, f"Host alias\n  {line}\n")
    conn = configured_connection(_spec(tmp_path, address="alias"), opts)
    assert not isinstance(conn, DirectConnection)
    assert type(conn).__module__.startswith("fabric")


def test_a_missing_runtime_ssh_config_is_left_to_fabric(tmp_path: Path) -> None:
    opts = ConnectOptions(ssh_config_path=str(tmp_path / "absent"))
    assert connection._ssh_config(opts) is None


def test_the_key_is_read_once_and_used_as_pkey(tmp_path: Path) -> None:
    from fleet.sandbox.local import generate_keypair

    key = tmp_path / "id_ed25519"
    generate_keypair(key, "test")
    opts = _options(tmp_path, "")
    first = configured_connection(_spec(tmp_path, ssh_key=str(key)), opts)
    second = configured_connection(_spec(tmp_path, name="h2", ssh_key=str(key)), opts)
    assert isinstance(first, DirectConnection) and isinstance(second, DirectConnection)
    assert "key_filename" not in first.connect_kwargs
    assert first.connect_kwargs["pkey"] is second.connect_kwargs["pkey"]
    assert first.connect_kwargs["look_for_keys"] is False
    # a key beside a certificate is left to paramiko, which also loads the certificate
    (tmp_path / "id_ed25519-cert.pub").write_text("x")
    third = configured_connection(_spec(tmp_path, name="h3", ssh_key=str(key)), opts)
    assert isinstance(third, DirectConnection)
    assert third.connect_kwargs["key_filename"] == [str(key)]


def test_retries_only_for_transient_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "RETRY_FIRST_WAIT", 0.001)
    monkeypatch.setattr(connection, "RETRY_MAX_WAIT", 0.002)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset")
        return "open"

    assert connection._with_retries(flaky, 3) == "open" and len(calls) == 3
    calls.clear()
    with pytest.raises(ConnectionResetError):
        connection._with_retries(flaky, 2)
    assert len(calls) == 2

    def denied() -> str:
        calls.append(1)
        raise paramiko.AuthenticationException("no")

    calls.clear()
    with pytest.raises(paramiko.AuthenticationException):
        connection._with_retries(denied, 5)
    assert len(calls) == 1


def test_paramiko_is_imported_without_invoke_and_match_exec_still_works() -> None:
    code = (
        "import sys\n"
        "import fleet.transport\n"
        "import paramiko\n"
        "assert 'invoke' not in sys.modules and 'asyncio' not in sys.modules, 'eager'\n"
        "cfg = paramiko.SSHConfig.from_text('Match exec true\\n  User bob\\n')\n"
        "assert cfg.lookup('x').get('user') == 'bob'\n"
        "assert 'invoke' in sys.modules\n"
        "import fabric\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr

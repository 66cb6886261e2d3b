"""The sandbox's pure core: plans, sshd_config, inventory, known_hosts, sshd log reading."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fleet.errors import UsageError
from fleet.inventory import parse_inventory
from fleet.sandbox import model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sandbox"


def _state(versions: list[str], backend: model.SandboxBackend = "local") -> model.SandboxState:
    hosts = [
        model.SandboxHost(
            name=name,
            vllm=version,
            port=40000 + i,
            home=f"/sb/hosts/{name}/home",
            python=f"/sb/hosts/{name}/home/ml-env/bin/python",
        )
        for i, (name, version) in enumerate(
            zip(model.host_names(len(versions)), versions, strict=True)
        )
    ]
    return model.SandboxState(
        backend=backend, dir="/sb", user="alice", versions=sorted(set(versions)), hosts=hosts
    )


@pytest.mark.parametrize(
    "version", ["0.17.0", "0.18.0", "0.10.2", "0.8.5.post1", "0.11.0rc1", "0.10.1.1", "1.0"]
)
def test_validate_version_accepts_release_numbers(version: str) -> None:
    assert model.validate_version(f" {version} ") == version


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "latest",
        "--pre",
        "0.17.0; rm -rf /",
        "0.17.0 --index-url x",
        "../0.17.0",
        "17",
        "0.17.0/../../x",
        "0.17.0\nx",
        "v0.17.0",
        "0.17.*",
        ">=0.17",
    ],
)
def test_validate_version_refuses_anything_else(bad: str) -> None:
    with pytest.raises(UsageError, match="not a vLLM version"):
        model.validate_version(bad)


@given(st.text(min_size=1, max_size=20))
def test_a_validated_version_never_looks_like_an_option_or_path(text: str) -> None:
    try:
        version = model.validate_version(text)
    except UsageError:
        return
    assert not version.startswith("-")
    assert all(c.isalnum() or c == "." for c in version)


def test_host_names_are_zero_padded_and_ordered() -> None:
    assert model.host_names(3) == ["sandbox-01", "sandbox-02", "sandbox-03"]
    names = model.host_names(120)
    assert names[0] == "sandbox-001" and names[-1] == "sandbox-120"
    assert names == sorted(names)


def test_versions_are_assigned_round_robin_in_the_order_given() -> None:
    assert model.assign_versions(5, ["0.18.0", "0.17.0"]) == [
        "0.18.0",
        "0.17.0",
        "0.18.0",
        "0.17.0",
        "0.18.0",
    ]
    assert model.assign_versions(2, ["0.17.0", "0.18.0", "0.15.0"]) == ["0.17.0", "0.18.0"]
    with pytest.raises(UsageError):
        model.assign_versions(3, [])


@pytest.mark.parametrize("count", [0, -1, model.MAX_HOSTS + 1])
def test_host_count_bounds(count: int) -> None:
    with pytest.raises(UsageError, match="--hosts"):
        model.validate_hosts(count)


@pytest.mark.parametrize("path", ['/tmp/a"b', "/tmp/a%h", "/tmp/a\nb", "/tmp/a\\b"])
def test_directories_sshd_config_cannot_quote_are_refused(path: str) -> None:
    with pytest.raises(UsageError, match="--dir"):
        model.validate_dir(path)


def test_sshd_config_quotes_paths_and_pins_one_user() -> None:
    text = model.render_sshd_config(
        port=40001,
        address="127.0.0.1",
        host_key="/s b/hosts/h/ssh_host_ed25519_key",
        pid_file="/s b/hosts/h/sshd.pid",
        authorized_keys="/s b/hosts/h/authorized_keys",
        user="alice",
        home="/s b/hosts/h/home",
        path="/s b/hosts/h/home/bin:/usr/bin:/bin",
        session_wrapper="/s b/hosts/h/session.sh",
        sftp_server="/usr/lib/openssh/sftp-server",
    )
    lines = text.splitlines()
    assert "Port 40001" in lines
    assert "ListenAddress 127.0.0.1" in lines
    assert 'HostKey "/s b/hosts/h/ssh_host_ed25519_key"' in lines
    assert "AllowUsers alice" in lines
    assert "PasswordAuthentication no" in lines
    assert "UsePAM no" in lines
    assert "LogLevel VERBOSE" in lines  # one "Connection from" line per connection
    assert (
        'SetEnv HOME="/s b/hosts/h/home" PATH="/s b/hosts/h/home/bin:/usr/bin:/bin" '
        "FLEET_SANDBOX=1" in lines
    )
    assert 'ForceCommand exec "/s b/hosts/h/session.sh"' in lines
    assert 'Subsystem sftp "/usr/lib/openssh/sftp-server"' in lines


def test_sshd_config_without_external_sftp_server_does_not_force_the_wrapper() -> None:
    text = model.render_sshd_config(
        port=2222,
        address="127.0.0.1",
        host_key="/k",
        pid_file="/p",
        authorized_keys="/a",
        user="u",
        home="/h",
        path="/bin",
        session_wrapper="/w",
        sftp_server=None,
        use_pam=True,
    )
    assert "ForceCommand" not in text
    assert "Subsystem sftp internal-sftp" in text
    assert "UsePAM yes" in text


def test_sshd_config_refuses_an_unquotable_path() -> None:
    with pytest.raises(UsageError):
        model.render_sshd_config(
            port=1,
            address="127.0.0.1",
            host_key='/k"',
            pid_file="/p",
            authorized_keys="/a",
            user="u",
            home="/h",
            path="/bin",
            session_wrapper=None,
            sftp_server=None,
        )


def test_known_hosts_line_uses_brackets_except_on_port_22() -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMmErl host-comment"
    assert model.known_hosts_line("127.0.0.1", 40001, key) == (
        "[127.0.0.1]:40001 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMmErl"
    )
    assert model.known_hosts_line("10.0.0.5", 22, key).startswith("10.0.0.5 ssh-ed25519 ")
    with pytest.raises(ValueError):
        model.known_hosts_line("127.0.0.1", 22, "garbage")


def test_inventory_is_read_by_fleets_own_parser() -> None:
    state = _state(["0.17.0", "0.18.0", "0.17.0"])
    text = model.render_inventory(
        state, ssh_key="/sb/client/id_ed25519", known_hosts="/sb/known_hosts"
    )
    inv = parse_inventory(yaml.safe_load(text), "inventory.yaml")
    assert list(inv.hosts) == ["sandbox-01", "sandbox-02", "sandbox-03"]
    assert inv.groups["vllm_0_17_0"] == ["sandbox-01", "sandbox-03"]
    assert inv.groups["vllm_0_18_0"] == ["sandbox-02"]
    assert inv.groups["sandbox"] == list(inv.hosts)
    spec = inv.hosts["sandbox-02"]
    assert (spec.address, spec.port, spec.user) == ("127.0.0.1", 40001, "alice")
    assert spec.python == "/sb/hosts/sandbox-02/home/ml-env/bin/python"
    assert spec.known_hosts == "/sb/known_hosts"
    assert spec.ssh_key == "/sb/client/id_ed25519"
    assert [h.name for h in inv.select(["vllm_0_18_0", "sandbox-01"])] == [
        "sandbox-01",
        "sandbox-02",
    ]


def test_inventory_quotes_awkward_paths() -> None:
    state = _state(["0.17.0"])
    odd = "/tmp/it's: a #dir/client/id_ed25519"
    text = model.render_inventory(state, ssh_key=odd, known_hosts="/k")
    inv = parse_inventory(yaml.safe_load(text), "inventory.yaml")
    assert inv.hosts["sandbox-01"].ssh_key == odd


def test_state_round_trips_and_rejects_unknown_keys() -> None:
    state = _state(["0.17.0", "0.18.0"])
    again = model.SandboxState.model_validate_json(state.model_dump_json())
    assert again == state
    assert again.host("sandbox-02").vllm == "0.18.0"
    with pytest.raises(UsageError, match="no sandbox host named 'nope'"):
        again.host("nope")
    data = state.model_dump()
    data["surprise"] = 1
    with pytest.raises(ValueError):
        model.SandboxState.model_validate(data)


def test_group_name_is_a_plain_identifier() -> None:
    assert model.group_name("0.17.0") == "vllm_0_17_0"
    assert model.group_name("0.8.5.post1") == "vllm_0_8_5_post1"


# -- sshd logs (recorded from real OpenSSH 9.2 runs) ---------------------------------------------


def test_connections_and_logins_counted_from_a_real_verbose_log() -> None:
    text = (FIXTURES / "sshd-two-sessions.log").read_text()
    assert model.count_connections(text) == 2
    assert model.count_logins(text) == 2
    assert model.count_connections("") == 0


def test_connections_counted_in_syslog_form_too() -> None:
    text = (FIXTURES / "sshd-two-sessions.log").read_text()
    syslog = "".join(f"Nov 29 13:00:01 host sshd[123]: {line}\n" for line in text.splitlines())
    assert model.count_connections(syslog) == 2
    journal = "".join(f"sshd[77]: {line}\n" for line in text.splitlines())
    assert model.count_logins(journal) == 2


def test_bind_failure_is_recognised() -> None:
    text = (FIXTURES / "sshd-bind-failed.log").read_text()
    assert model.sshd_bind_failed(text)
    assert not model.sshd_bind_failed((FIXTURES / "sshd-two-sessions.log").read_text())
    assert model.sshd_error_line(text) == (
        "Bind to port 49285 on 127.0.0.1 failed: Address already in use."
    )


def test_missing_privsep_directory_is_recognised() -> None:
    text = (FIXTURES / "sshd-missing-privsep.log").read_text()
    assert model.sshd_missing_privsep_dir(text) == "/run/sshd"
    assert model.sshd_missing_privsep_dir("Server listening on 127.0.0.1 port 2.") is None


def test_error_line_names_the_bad_option() -> None:
    text = (FIXTURES / "sshd-bad-option.log").read_text()
    assert "Bad configuration option: Bogus" in model.sshd_error_line(text)
    assert model.sshd_error_line("") == "sshd exited without a message"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026", "OpenSSH_9.2p1"),
        ("OpenSSH_9.2, OpenSSL 3.0.19 27 Jan 2026", "OpenSSH_9.2"),
        ("unknown option -- V\nOpenSSH_8.9p1 Ubuntu-3ubuntu0.10, OpenSSL 3.0.2", "OpenSSH_8.9p1"),
        ("sshd: command not found", None),
    ],
)
def test_openssh_version_parsed(text: str, expected: str | None) -> None:
    assert model.parse_openssh_version(text) == expected

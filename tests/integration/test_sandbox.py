"""The sandbox hosts themselves, checked with OpenSSH's own client (``ssh``, strict keys).

These tests do not go through fleet's transport: they prove that what `fleet sandbox up`
builds is a host a stock SSH client accepts only with the pinned key, that it holds the
real vLLM files of its version and the nvidia-smi stand-in, and that `down` stops exactly
what `up` started.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from openssh_client import ssh, ssh_argv

from fleet.inventory import load_inventory
from fleet.sandbox import model
from fleet.sandbox.core import Sandbox
from fleet.sandbox.procs import ProcessRecord, start_token

pytestmark = pytest.mark.integration


# -- what a host is ---------------------------------------------------------------------------


def test_inventory_is_the_design_contract_and_loads(shared_sandbox: Sandbox) -> None:
    box = shared_sandbox
    inv = load_inventory(box.inventory_path)
    assert [h.name for h in inv.select(["all"])] == [h.name for h in box.hosts]
    assert [h.vllm for h in box.hosts] == ["0.17.0", "0.18.0", "0.17.0"]  # round-robin
    assert [h.name for h in inv.select(["vllm_0_18_0"])] == [box.hosts[1].name]
    for spec, host in zip(inv.select(["all"]), box.hosts, strict=True):
        assert (spec.address, spec.port, spec.python) == (host.address, host.port, host.python)
        assert spec.user == box.state.user
        assert spec.known_hosts == str(box.known_hosts_path)
        assert spec.ssh_key == str(box.client_key_path)
    # distinct ports, one pinned key per host, and every key different
    assert len({h.port for h in box.hosts}) == len(box.hosts)
    lines = box.known_hosts_path.read_text().splitlines()
    assert len(lines) == len(box.hosts)
    assert len({line.split()[2] for line in lines}) == len(box.hosts)


@pytest.mark.docker
def test_host_has_real_vllm_files_of_its_version_and_own_home(shared_sandbox: Sandbox) -> None:
    box = shared_sandbox
    probe = (
        "import importlib.util, importlib.metadata as md, json, os, sys;"
        "spec = importlib.util.find_spec('vllm');"
        "print(json.dumps({'version': md.version('vllm'),"
        " 'dir': list(spec.submodule_search_locations),"
        " 'imported': 'vllm' in sys.modules, 'cwd': os.getcwd(),"
        " 'home': os.path.expanduser('~')}))"
    )
    for host in box.hosts:
        res = ssh(box, host.name, f"{shlex.quote(host.python)} -c {shlex.quote(probe)}")
        assert res.returncode == 0, res.stderr
        facts = json.loads(res.stdout)
        assert facts["version"] == host.vllm
        assert facts["imported"] is False
        assert facts["cwd"] == facts["home"] == host.home
        pkg = Path(facts["dir"][0])
        if box.state.backend == "local":
            # the real wheel's file, byte for byte
            from fleet.sandbox.vllm_source import vllm_file

            rel = "model_executor/models/deepseek_v2.py"
            assert (pkg / rel).read_bytes() == vllm_file(host.vllm, rel).read_bytes()


@pytest.mark.docker
def test_eagle3_interface_differs_between_017_and_018(shared_sandbox: Sandbox) -> None:
    box = shared_sandbox
    found = {}
    for host in box.hosts[:2]:
        cmd = (
            f"{shlex.quote(host.python)} -c 'import importlib.util as u;"
            'print(u.find_spec("vllm").submodule_search_locations[0])\''
        )
        pkg = ssh(box, host.name, cmd).stdout.strip()
        target = f"{pkg}/model_executor/models/deepseek_v2.py"
        res = ssh(box, host.name, f"grep -c SupportsEagle3 {shlex.quote(target)}")
        found[host.vllm] = int(res.stdout.strip() or 0)
    assert found["0.17.0"] == 0
    assert found["0.18.0"] > 0


@pytest.mark.docker
def test_nvidia_smi_stand_in_reports_eight_b200(shared_sandbox: Sandbox) -> None:
    box = shared_sandbox
    host = box.hosts[0]
    res = ssh(
        box,
        host.name,
        "nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split(", ") for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == [str(i) for i in range(8)]
    assert {r[1] for r in rows} == {"NVIDIA B200"}
    assert {r[2] for r in rows} == {"183359 MiB"}
    bad = ssh(box, host.name, "nvidia-smi --query-gpu=bogus --format=csv")
    assert bad.returncode == 2
    assert 'Field "bogus" is not a valid field to query.' in bad.stdout


@pytest.mark.docker
def test_strict_client_refuses_a_key_not_pinned(shared_sandbox: Sandbox, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    res = ssh(shared_sandbox, shared_sandbox.hosts[0].name, "true", known_hosts=empty)
    assert res.returncode == 255
    assert "host key" in res.stderr.lower()


@pytest.mark.docker
def test_one_connection_per_ssh_invocation_is_logged(shared_sandbox: Sandbox) -> None:
    box = shared_sandbox
    name = box.hosts[2].name
    mark = box.log_marks()[name]
    for _ in range(3):
        assert ssh(box, name, "true").returncode == 0
    assert box.connection_count(name, since=mark) == 3
    assert box.login_count(name, since=mark) == 3


def test_sftp_works_relative_to_the_host_home(shared_sandbox: Sandbox, tmp_path: Path) -> None:
    box = shared_sandbox
    host = box.hosts[1]
    local = tmp_path / "probe.txt"
    local.write_text("hello sandbox\n")
    batch = tmp_path / "batch"
    batch.write_text(f"put {local} sftp-probe.txt\nrm sftp-probe.txt\n")
    res = subprocess.run(
        [
            "sftp",
            "-F",
            "/dev/null",
            "-b",
            str(batch),
            "-i",
            str(box.client_key_path),
            "-o",
            f"UserKnownHostsFile={box.known_hosts_path}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-P",
            str(host.port),
            f"{box.state.user}@{host.address}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    if box.state.backend == "local":
        assert not (Path(host.home) / "sftp-probe.txt").exists()


# -- knobs: down hosts, crashes, key changes ------------------------------------------------------


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",))
@pytest.mark.docker
def test_stop_and_start_a_host_keeps_address_and_key(sandbox: Sandbox) -> None:
    name = sandbox.hosts[0].name
    other = sandbox.hosts[1].name
    sandbox.stop_host(name)
    assert not sandbox.running(name)
    down = ssh(sandbox, name, "true", timeout=30)
    assert down.returncode == 255
    assert "refused" in down.stderr.lower()
    assert ssh(sandbox, other, "true").returncode == 0  # the other host is unaffected
    sandbox.start_host(name)
    assert sandbox.running(name)
    assert ssh(sandbox, name, "echo back").stdout.strip() == "back"


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",))
def test_kill_host_mid_session_ends_the_session(sandbox: Sandbox) -> None:
    if sandbox.state.backend != "local":
        pytest.skip("process-level checks apply to the local backend")
    name = sandbox.hosts[0].name
    argv = ssh_argv(sandbox, name, "echo started; sleep 120")
    mark = sandbox.log_marks()[name]
    client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert sandbox.wait_for_log(name, "Starting session", since=mark)
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "started"
        killed = sandbox.kill_host(name)
        # the listener plus the session's sshd process(es) and the remote shell/sleep
        assert len(killed) >= 3
        assert client.wait(timeout=30) != 0
        for pid in killed:
            assert start_token(pid) is None  # gone (or a zombie awaiting its reaper)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert not sandbox.running(name)
    assert ssh(sandbox, sandbox.hosts[1].name, "true").returncode == 0


@pytest.mark.sandbox(hosts=1, vllm=("0.18.0",))
@pytest.mark.docker
def test_rotated_host_key_is_refused_until_pinned_again(sandbox: Sandbox) -> None:
    name = sandbox.hosts[0].name
    before = sandbox.known_hosts_path.read_text()
    sandbox.rotate_host_key(name)
    assert sandbox.known_hosts_path.read_text() == before  # fleet's pin is unchanged
    res = ssh(sandbox, name, "true")
    assert res.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr
    sandbox.pin()
    assert ssh(sandbox, name, "true").returncode == 0


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",), pinned=False)
def test_unpinned_sandbox_has_empty_known_hosts(sandbox: Sandbox) -> None:
    assert sandbox.known_hosts_path.read_text() == ""
    res = ssh(sandbox, sandbox.hosts[0].name, "true")
    assert res.returncode == 255
    sandbox.pin([sandbox.hosts[0].name])
    assert ssh(sandbox, sandbox.hosts[0].name, "true").returncode == 0
    assert ssh(sandbox, sandbox.hosts[1].name, "true").returncode == 255


# -- down stops exactly what up started ----------------------------------------------------------


def test_down_stops_exactly_what_up_started(
    sandbox_factory: Callable[..., Sandbox], tmp_path: Path
) -> None:
    mine = sandbox_factory(2, ("0.17.0",), name="down-mine")
    bystander = sandbox_factory(1, ("0.17.0",), name="down-bystander")
    if mine.state.backend != "local":
        pytest.skip("pid-level checks apply to the local backend")
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        listeners = [_listener(mine, h.name) for h in mine.hosts]
        assert all(r.alive() for r in listeners)
        # A process started in a session and registered in the host's run dir (as a
        # simulated server would) is stopped too; a pid file naming a process that does not
        # run in the host's home is left alone.
        host = mine.hosts[0]
        started = ssh(
            mine,
            host.name,
            "setsid sleep 300 </dev/null >/dev/null 2>&1 & "
            "echo $! > ~/.fleet-sandbox/run/workload.pid; echo $!",
        )
        workload = ProcessRecord.of(int(started.stdout.strip()))
        assert workload is not None and workload.alive()
        (Path(mine.hosts[1].home) / ".fleet-sandbox" / "run" / "stranger.pid").write_text(
            f"{unrelated.pid}\n"
        )

        stopped = mine.down()

        assert sorted(stopped) == sorted(h.name for h in mine.hosts)
        assert not any(r.alive() for r in listeners)
        assert not workload.alive()
        assert unrelated.poll() is None, "down signalled a process it did not start"
        assert all(bystander.running(h.name) for h in bystander.hosts)
        assert ssh(bystander, bystander.hosts[0].name, "true").returncode == 0
        # safe to run twice
        assert mine.down() == []
    finally:
        unrelated.kill()
        unrelated.wait()


def _listener(box: Sandbox, name: str) -> ProcessRecord:
    text = (box.dir / "hosts" / name / "listener.json").read_text()
    record = ProcessRecord.from_json(text)
    assert record is not None
    return record


@pytest.mark.sandbox(hosts=1, vllm=("0.17.0",))
def test_down_never_signals_a_recycled_pid(sandbox: Sandbox) -> None:
    if sandbox.state.backend != "local":
        pytest.skip("pid-level checks apply to the local backend")
    name = sandbox.hosts[0].name
    real = _listener(sandbox, name)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        # The pid file now names a live process that is not the one up started (its start
        # time differs), as after a reboot or pid reuse: down must leave it alone.
        fake = {"pid": other.pid, "start": "1"}
        listener_file = sandbox.dir / "hosts" / name / "listener.json"
        listener_file.write_text(json.dumps(fake))
        assert sandbox.down() == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
        listener_file.write_text(real.to_json())
        sandbox.down()
    assert not real.alive()


# -- the command line -------------------------------------------------------------------------


def _fleet(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_cli_up_status_down(tmp_path: Path) -> None:
    d = tmp_path / "cli box"  # a space in the directory is fine
    up = _fleet(
        "--json",
        "sandbox",
        "up",
        "--hosts",
        "3",
        "--vllm",
        "0.17.0",
        "--vllm",
        "0.18.0",
        "--load-seconds",
        "1.5",
        "--dir",
        str(d),
    )
    try:
        assert up.returncode == 0, up.stderr
        doc = json.loads(up.stdout)
        assert [h["vllm"] for h in doc["hosts"].values()] == ["0.17.0", "0.18.0", "0.17.0"]
        assert all(h["running"] for h in doc["hosts"].values())
        assert doc["load_seconds"] == 1.5
        inventory = yaml.safe_load((d / "inventory.yaml").read_text())
        assert set(inventory["all"]["children"]) == {"sandbox", "vllm_0_17_0", "vllm_0_18_0"}
        host_json = json.loads(
            (d / "hosts" / "sandbox-02" / "home" / ".fleet-sandbox" / "host.json").read_text()
        )
        assert host_json["vllm"] == "0.18.0" and host_json["load_seconds"] == 1.5

        status = _fleet("sandbox", "status", "--dir", str(d))
        assert status.returncode == 0
        assert "sandbox-03" in status.stdout

        again = _fleet("sandbox", "up", "--dir", str(d))
        assert again.returncode == 2
        assert again.stderr.count("\n") == 1 and "already up" in again.stderr
        assert "Traceback" not in again.stderr
    finally:
        first = _fleet("sandbox", "down", "--dir", str(d))
    assert first.returncode == 0
    assert "stopped 3 host(s)" in first.stdout
    second = _fleet("sandbox", "down", "--dir", str(d))
    assert second.returncode == 0
    assert "nothing running" in second.stdout
    after = _fleet("--json", "sandbox", "status", "--dir", str(d))
    assert after.returncode == 1
    assert not any(h["running"] for h in json.loads(after.stdout)["hosts"].values())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--vllm", "0.17.0; touch /tmp/fleet-pwned"], "not a vLLM version"),
        (["--vllm", "--pre"], "not a vLLM version"),
        (["--hosts", "0"], "between 1 and"),
        (["--load-seconds", "-1"], "must not be negative"),
    ],
)
def test_cli_up_rejects_bad_input_with_one_line(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    res = _fleet("sandbox", "up", "--dir", str(tmp_path / "box"), *args)
    assert res.returncode == 2
    assert needle in res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert not (tmp_path / "box" / "sandbox.json").exists()


def test_cli_status_without_sandbox(tmp_path: Path) -> None:
    res = _fleet("sandbox", "status", "--dir", str(tmp_path))
    assert res.returncode == 1
    assert "no sandbox in" in res.stdout


def test_fleet_ping_and_inspect_use_the_inventory_unedited(shared_sandbox: Sandbox) -> None:
    """The fleet's own transport accepts the sandbox (one connection per host per run)."""
    box = shared_sandbox
    marks = box.log_marks()
    res = box.run_fleet("--json", "inspect", "--host", "all")
    assert res.returncode == 0, res.stderr
    hosts = json.loads(res.stdout)["hosts"]
    for host in box.hosts:
        facts = hosts[host.name]
        assert facts["ok"] is True
        assert facts["vllm"]["version"] == host.vllm
        assert len(facts["gpus"]) == 8
        expected = host.vllm == "0.18.0"
        assert facts["vllm"]["eagle3"]["DeepseekV2ForCausalLM"] is expected
        assert box.connection_count(host.name, since=marks[host.name]) == 1


def test_up_cleans_up_when_a_host_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing half-started: if one sshd fails, up stops the others and reports it."""
    from fleet.errors import OperationFailed
    from fleet.sandbox import local

    real_start = local.LocalBackend.start
    calls: list[str] = []

    def flaky_start(
        self: local.LocalBackend, host: model.SandboxHost, *, may_move: bool = False
    ) -> int:
        calls.append(host.name)
        if host.name.endswith("-02"):
            # a real failure: sshd refuses a broken configuration
            (self.host_dir(host.name) / "ssh_host_ed25519_key").write_text("not a key\n")
        return real_start(self, host, may_move=may_move)

    monkeypatch.setattr(local.LocalBackend, "start", flaky_start)
    with pytest.raises(OperationFailed, match="sandbox-02: sshd did not start"):
        Sandbox.up(tmp_path / "box", hosts=3, versions=["0.17.0"], workers=1, backend="local")
    box = Sandbox(tmp_path / "box")
    assert box.exists()
    assert not any(s.running for s in box.status())
    assert sorted(calls) == ["sandbox-01", "sandbox-02"]


def test_sshd_children_are_not_left_as_zombies(tmp_path: Path) -> None:
    """sshd processes started in-process are reaped when stopped."""
    box = Sandbox.up(tmp_path / "box", hosts=1, versions=["0.17.0"], backend="local")
    record = _listener(box, box.hosts[0].name)
    box.down()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{record.pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{record.pid}").exists()

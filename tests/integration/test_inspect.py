"""``fleet inspect`` against real sshd sandbox hosts holding the real vLLM 0.17.0 / 0.18.0.

Each host must get exactly one SSH connection and one command (one round trip); both are
counted from the host's own sshd log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.facts.models import EAGLE3_CLASSES
from fleet.sandbox.core import Sandbox

pytestmark = pytest.mark.integration

SESSION_RE = re.compile(r"Starting session: ")


def sessions(box: Sandbox, name: str, since: int) -> int:
    return len(SESSION_RE.findall(box.sshd_log(name)[since:]))


def inspect_json(box: Sandbox, *hosts: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    args = [a for h in (hosts or ("all",)) for a in ("--host", h)]
    res = box.run_fleet("--json", "inspect", *args)
    return res, json.loads(res.stdout) if res.stdout.strip() else None


@pytest.mark.docker
def test_inspect_json_per_version_one_round_trip(shared_sandbox: Sandbox) -> None:
    box = shared_sandbox
    marks = box.log_marks()
    res, doc = inspect_json(box)
    assert res.returncode == 0, res.stderr
    assert set(doc) == {"hosts"}
    assert list(doc["hosts"]) == [h.name for h in box.hosts]
    for host in box.hosts:
        facts = doc["hosts"][host.name]
        assert facts["ok"] is True
        expected = host.vllm == "0.18.0"
        assert facts["vllm"]["version"] == host.vllm
        assert facts["vllm"]["eagle3"] == {cls: expected for cls in EAGLE3_CLASSES}
        assert facts["vllm"]["path"].endswith("/site-packages/vllm")
        assert facts["vllm"]["eagle3_allowlist"]["deepseek"] is expected
        assert facts["vllm"]["eagle3_allowlist"]["kimi"] is expected
        gpus = facts["gpus"]
        assert [g["index"] for g in gpus] == list(range(8))
        assert {g["name"] for g in gpus} == {"NVIDIA B200"}
        assert all(isinstance(g["memory_total_mib"], int) for g in gpus)
        assert all(isinstance(g["memory_used_mib"], int) for g in gpus)
        assert re.fullmatch(r"\d+\.\d+\.\d+", facts["python"])
        assert facts["driver"] and facts["hostname"]
        assert set(facts["disk"]) == {"home", "vllm"}
        assert facts["errors"] == {}
        # one round trip: one TCP connection and one command per host
        assert box.connection_count(host.name, since=marks[host.name]) == 1
        assert sessions(box, host.name, marks[host.name]) == 1


@pytest.mark.docker
def test_inspect_for_people(shared_sandbox: Sandbox) -> None:
    res = run_fleet(shared_sandbox.inventory_path, "inspect", "--host", "all")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for host in shared_sandbox.hosts:
        row = next(line for line in out.splitlines() if line.strip().startswith(host.name))
        assert host.vllm in row
        assert ("✓ ✓ ✓" if host.vllm == "0.18.0" else "✗ ✗ ✗") in row
    assert out.count("8 × NVIDIA B200") == len(shared_sandbox.hosts)


@pytest.mark.docker
def test_inspect_details_panel(shared_sandbox: Sandbox) -> None:
    name = next(h.name for h in shared_sandbox.hosts if h.vllm == "0.18.0")
    res = run_fleet(shared_sandbox.inventory_path, "inspect", "--host", name)
    assert res.returncode == 0, res.stderr
    assert "DeepseekV3ForCausalLM" in res.stdout
    assert "via DeepseekV3ForCausalLM -> DeepseekV2ForCausalLM" in res.stdout
    assert "aux_hidden_states_supported" in res.stdout


def _inventory_copy(box: Sandbox, tmp_path: Path, change: dict[str, dict[str, Any]]) -> Path:
    data = yaml.safe_load(box.inventory_path.read_text())
    hosts = data["all"]["children"]["sandbox"]["hosts"]
    for name, values in change.items():
        hosts[name] = {**hosts.get(name, {}), **values}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_fleet(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLEET_CONNECT_ATTEMPTS="1", COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "fleet", "--inventory", str(inventory), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


@pytest.mark.docker
def test_wrong_python_fails_that_host_only(shared_sandbox: Sandbox, tmp_path: Path) -> None:
    first, second = shared_sandbox.hosts[0].name, shared_sandbox.hosts[1].name
    inventory = _inventory_copy(
        shared_sandbox, tmp_path, {first: {"python": "/nonexistent/bin/python3"}}
    )
    res = run_fleet(inventory, "--json", "inspect", "--host", first, "--host", second)
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["hosts"][first]["ok"] is False
    assert "/nonexistent/bin/python3" in doc["hosts"][first]["error"]
    assert doc["hosts"][second]["ok"] is True


def test_host_without_vllm_is_reported_not_failed(shared_sandbox: Sandbox, tmp_path: Path) -> None:
    # the system interpreter of the host: Python runs, vLLM is not installed for it
    name = shared_sandbox.hosts[0].name
    inventory = _inventory_copy(shared_sandbox, tmp_path, {name: {"python": sys.executable}})
    res = run_fleet(inventory, "--json", "inspect", "--host", name)
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)["hosts"][name]
    assert facts["ok"] is True and facts["vllm"]["installed"] is False
    assert facts["vllm"]["eagle3"] == {} and len(facts["gpus"]) == 8


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0", "0.18.0"))
@pytest.mark.docker
def test_one_host_down(sandbox: Sandbox) -> None:
    down, up = sandbox.hosts[0].name, sandbox.hosts[1].name
    sandbox.stop_host(down)
    res, doc = inspect_json(sandbox)
    assert res.returncode == 3, res.stderr
    assert doc["hosts"][down]["ok"] is False and doc["hosts"][down]["status"] == "unreachable"
    assert doc["hosts"][down]["error"]
    assert doc["hosts"][up]["ok"] is True
    assert doc["hosts"][up]["vllm"]["eagle3"]["DeepseekV2ForCausalLM"] is True
    # for people: the table lists the host and the error line names it
    res = sandbox.run_fleet("inspect", "--host", "all")
    assert res.returncode == 3
    assert any(line.startswith(f"{down}: ") for line in res.stdout.splitlines())


def test_running_vllm_server_is_seen(shared_sandbox: Sandbox, tmp_path: Path) -> None:
    """A process started as ``vllm serve MODEL --port N`` shows up under servers."""
    if shared_sandbox.state.backend != "local":
        pytest.skip("the sandbox hosts do not share this machine's process table")
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    fake.chmod(0o755)
    # argv as the kernel sets it: [python, .../vllm, serve, MODEL, --port, 8123]; Popen
    # returns after the exec, so the command line is already in /proc
    secret = "sk-inspectsecret0123456789abcdef"
    proc = subprocess.Popen(
        [str(fake), "serve", "/models/Kimi-K2.5", "--port", "8123", "--api-key", secret]
    )
    try:
        name = shared_sandbox.hosts[0].name
        res, doc = inspect_json(shared_sandbox, name)
        assert res.returncode == 0, res.stderr
        servers = [s for s in doc["hosts"][name]["servers"] if s["pid"] == proc.pid]
        assert len(servers) == 1, doc["hosts"][name]["servers"]
        assert servers[0]["model"] == "/models/Kimi-K2.5" and servers[0]["port"] == 8123
        # the API key on its command line is masked in every output
        assert servers[0]["argv"][-2:] == ["--api-key", "***"]
        assert secret not in res.stdout
        human = shared_sandbox.run_fleet("inspect", "--host", name, "--details")
        assert human.returncode == 0 and "port 8123" in human.stdout
        assert secret not in human.stdout
    finally:
        proc.kill()
        proc.wait()

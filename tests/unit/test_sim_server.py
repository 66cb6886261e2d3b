"""The rehearsal vLLM as a running server: its processes, GPU memory, socket, endpoints.

Real processes: the simulator is started as `vllm serve` from its executable against the
real 0.17.0 tree (patched), and observed from outside as an operator or fleet would:
/proc, the nvidia-smi stand-in's state file, TCP connects, HTTP, Prometheus text parsed
with prometheus_client.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sim_harness import Sim, make_home, patched_tree, run_sim, serve_args

from fleet.onhost.rehearsal import nvidia_smi
from fleet.sandbox.vllm_source import vllm_tree


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return patched_tree("0.17.0", tmp_path_factory.mktemp("server-trees"))


def http(url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def refused(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
    return False


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def metrics(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    status, body = http(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_processes_gpu_memory_and_socket_during_the_load(tree: Path, tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", load_seconds=4.0)
    sim = Sim(home, tree, serve_args(home, "0.17.0"))
    try:
        assert sim.wait_for(b"Loading safetensors checkpoint shards:  1", 60)
        # the process tree of vLLM: APIServer -> EngineCore -> 8 workers, one group
        engine = [p for p in children(sim.proc.pid) if cmdline(p)[0] == "VLLM::EngineCore"]
        assert len(engine) == 1
        workers = sorted(children(engine[0]), key=lambda p: cmdline(p)[0])
        assert [cmdline(p)[0] for p in workers] == [f"VLLM::Worker_TP{k}" for k in range(8)]
        group = os.getpgid(sim.proc.pid)
        assert {os.getpgid(p) for p in [*engine, *workers]} == {group}
        # the pids in the prefixes are the pids of the processes that wrote the lines
        text = sim.output().decode()
        assert f"(EngineCore_DP0 pid={engine[0]}) " in text
        for k, pid in enumerate(workers):
            assert f"(Worker pid={pid}) " in text
            if k == 0:
                assert f"(Worker pid={pid}) (Worker_TP0 pid={pid}) " in text
        # bound, not listening: connection refused (docs/research/vllm-serve.md §0.5)
        assert refused(sim.port)
        # GPU memory grows with the shards, per worker on its own GPU (nvidia-smi)
        time.sleep(0.5)
        config = nvidia_smi.load_config(str(home))
        used = [g["memory.used"] for g in nvidia_smi.gpus(config)]
        assert all(u > 0 for u in used) and len(set(used)) == 1
        apps = config["state"]["processes"]
        assert sorted((p["pid"], p["gpus"]) for p in apps) == [
            (pid, [k]) for k, pid in enumerate(workers)
        ]
        assert sim.wait_for(b"Application startup complete.", 60)
        assert not refused(sim.port)
        loaded = [g["memory.used"] for g in nvidia_smi.gpus(nvidia_smi.load_config(str(home)))]
        assert min(loaded) > 0.85 * nvidia_smi.DEFAULTS["memory_total_mib"]
        sim.signal(signal.SIGTERM)
        assert sim.wait(30) == 0
        time.sleep(0.2)
        for pid in [*engine, *workers]:
            assert (
                not Path(f"/proc/{pid}").exists()
                or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
            )
        after = nvidia_smi.load_config(str(home))
        assert [g["memory.used"] for g in nvidia_smi.gpus(after)] == [0] * 8
        assert after["state"]["processes"] == []
    finally:
        if sim.proc.poll() is None:
            sim.kill()


def test_sigkill_of_the_server_takes_its_children_and_gpu_memory(
    tree: Path, tmp_path: Path
) -> None:
    home = make_home(tmp_path / "home", load_seconds=4.0)
    sim = Sim(home, tree, serve_args(home, "0.17.0"))
    try:
        assert sim.wait_for(b"Loading safetensors checkpoint shards:  1", 60)
        engine = children(sim.proc.pid)
        kids = engine + [w for e in engine for w in children(e)]
        assert len(kids) == 9
        os.kill(sim.proc.pid, signal.SIGKILL)  # only the APIServer, as the OOM killer would
        sim.proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in kids):
            time.sleep(0.1)
        assert not any(
            Path(f"/proc/{p}/cmdline").exists() and cmdline(p)[0].startswith("VLLM::") for p in kids
        )
        state = json.loads((home / ".fleet-sandbox" / "gpu-state.json").read_text())
        assert state["processes"] == [] and state["memory_used_mib"] == [0] * 8
    finally:
        if sim.proc.poll() is None:
            sim.kill()


def test_endpoints_metrics_and_acceptance_rate(tree: Path, tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", load_seconds=0.5, knobs={"acceptance_rate": 0.7})
    sim = Sim(home, tree, serve_args(home, "0.17.0"))
    try:
        assert sim.wait_for(b"Application startup complete.", 60)
        base = f"http://127.0.0.1:{sim.port}"
        assert http(base + "/health") == (200, b"")
        status, body = http(base + "/v1/models")
        models = json.loads(body)
        assert status == 200 and models["object"] == "list"
        card = models["data"][0]
        assert card["id"] == "kimi-k2.5" and card["owned_by"] == "vllm"
        assert (
            card["root"] == str(home / "models" / "Kimi-K2.5") and card["max_model_len"] == 262144
        )
        before = metrics(sim.port)
        assert before["vllm:spec_decode_num_drafts_total"] == {
            (("engine", "0"), ("model_name", "kimi-k2.5")): 0.0
        }
        texts = set()
        for prompt in ("hello", "a longer prompt about speculative decoding", "hello"):
            status, body = http(
                base + "/v1/completions",
                {"model": "kimi-k2.5", "prompt": prompt, "max_tokens": 200},
            )
            assert status == 200
            doc = json.loads(body)
            assert doc["usage"]["completion_tokens"] == 200
            texts.add((prompt, doc["choices"][0]["text"]))
        assert len(texts) == 2  # deterministic: the same prompt gives the same text
        after = metrics(sim.port)
        key = (("engine", "0"), ("model_name", "kimi-k2.5"))
        drafts = after["vllm:spec_decode_num_drafts_total"][key]
        draft_tokens = after["vllm:spec_decode_num_draft_tokens_total"][key]
        accepted = after["vllm:spec_decode_num_accepted_tokens_total"][key]
        assert draft_tokens == 3 * drafts and drafts > 0
        assert abs(accepted / draft_tokens - 0.7) < 0.03  # the host's acceptance rate
        per_pos = after["vllm:spec_decode_num_accepted_tokens_per_pos_total"]
        positions = [
            per_pos[(("engine", "0"), ("model_name", "kimi-k2.5"), ("position", str(i)))]
            for i in range(3)
        ]
        assert positions == sorted(positions, reverse=True) and sum(positions) == accepted
        assert "vllm:spec_decode_num_drafts_created" in after
        assert after["vllm:generation_tokens_total"][key] == 600
        # access log lines, on the APIServer's stdout, as uvicorn writes them
        assert re.search(
            rb'\(APIServer pid=\d+\) INFO:     127\.0\.0\.1:\d+ - "GET /metrics HTTP/1\.1" 200 OK',
            sim.output(),
        )
        status, body = http(base + "/v1/completions", {"model": "other", "prompt": "x"})
        assert status == 404 and b"does not exist" in body
    finally:
        sim.signal(signal.SIGTERM)
        sim.wait(30)


def test_api_key_from_the_environment_guards_v1(tree: Path, tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", load_seconds=0.3)
    sim = Sim(home, tree, serve_args(home, "0.17.0"), env={"VLLM_API_KEY": "s3cret-token"})
    try:
        assert sim.wait_for(b"Application startup complete.", 60)
        base = f"http://127.0.0.1:{sim.port}"
        assert http(base + "/health")[0] == 200  # not under /v1
        assert http(base + "/v1/models") == (401, b'{"error": "Unauthorized"}')
        assert http(base + "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert http(base + "/v1/models", headers={"Authorization": "Bearer s3cret-token"})[0] == 200
        assert b"s3cret-token" not in sim.output()  # from the environment: not in the args line
    finally:
        sim.signal(signal.SIGTERM)
        sim.wait(30)


def test_numbered_lines_have_no_gaps_or_duplicates(tree: Path, tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", load_seconds=0.5, knobs={"number_lines": True})
    run = run_sim(home, tree, serve_args(home, "0.17.0"))
    assert run.ready and run.returncode == 0
    lines = run.physical_lines()
    seqs = []
    for line in lines:
        match = re.search(r" \[seq=(\d+)\]\r?$", line)
        assert match, repr(line)
        seqs.append(int(match.group(1)))
    assert seqs == list(range(1, len(lines) + 1))


def _python38() -> str | None:
    import glob

    for exe in [
        shutil.which("python3.8"),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8.*/bin/python3"))),
    ]:
        if exe and subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0:
            return exe
    return None


PYTHON38 = _python38()


@pytest.mark.skipif(PYTHON38 is None, reason="no Python 3.8 on this machine")
def test_runs_on_python_38(tree: Path, tmp_path: Path) -> None:
    """The oldest interpreter a host may have (the on-host contract: 3.8+, stdlib only)."""
    assert PYTHON38 is not None
    home = make_home(tmp_path / "home", load_seconds=0.3, python=PYTHON38)
    run = run_sim(home, tree, serve_args(home, "0.17.0"))
    assert run.ready and run.returncode == 0, run.text[-2000:]
    assert (home / "vllm").read_text().startswith("#!" + PYTHON38 + "\n")


def test_the_executable_runs_from_an_interpreter_path_with_spaces(tmp_path: Path) -> None:
    """A sandbox directory may hold spaces (and pytest's tmp paths get long): the first
    line is then pip's /bin/sh trampoline instead of a shebang the kernel cannot read."""
    from fleet.onhost.client import SHEBANG_MAX, executable

    spaced = tmp_path / "a dir with spaces" / "python"
    spaced.parent.mkdir()
    spaced.symlink_to(sys.executable)
    long = tmp_path / ("x" * (SHEBANG_MAX + 1)) / "python"
    long.parent.mkdir()
    long.symlink_to(sys.executable)
    plain = Path(sys.executable)
    for i, python in enumerate((spaced, long, plain)):
        exe = tmp_path / f"vllm-{i}"
        exe.write_text(executable("rehearsal.vllm_sim", "main", str(python)))
        exe.chmod(0o755)
        assert exe.read_text().startswith("#!/bin/sh\n" if python != plain else f"#!{plain}\n")
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(vllm_tree("0.17.0"))}
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=env)
        assert (out.returncode, out.stdout) == (0, "0.17.0\n"), out.stderr

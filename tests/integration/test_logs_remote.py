"""``fleet logs`` against a real sshd sandbox host: filtered remote diagnosis at scale.

The logs are written *on* the host (generated there by its own Python, or sent over SSH),
then diagnosed by ``fleet`` run as a real process. Assertions about the host are checked
through a separate SSH connection, never through the code under test.
"""

# ruff: noqa: E501  (real vLLM messages are long lines)

from __future__ import annotations

import importlib.util
import json
import os
import select
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.sandbox.core import Sandbox

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SIZE = 64 * 2**20


def _generator() -> str:
    spec = importlib.util.spec_from_file_location(
        "bench_diagnose", ROOT / "benchmarks" / "bench_diagnose.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.GENERATOR)


@pytest.fixture(scope="module")
def box(sandbox_factory: Any) -> Iterator[Sandbox]:
    sandbox = sandbox_factory(1, ("0.17.0",), name="logs-sandbox")
    yield sandbox


def on_host(box: Sandbox, command: str, stdin: str | bytes | None = None) -> str:
    return box.on_host(box.hosts[0].name, command, stdin=stdin).stdout


def fleet(box: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return box.run_fleet(*args, timeout=600)


def write_log(box: Sandbox, profile: str, text: str) -> None:
    on_host(
        box,
        f'mkdir -p "$HOME/.fleet/run/{profile}" && cat > "$HOME/.fleet/run/{profile}/vllm.log"',
        stdin=text,
    )


@pytest.mark.docker
def test_large_log_is_diagnosed_moving_a_small_fraction(box: Sandbox) -> None:
    host = box.hosts[0]
    python = shlex.quote(host.python)
    on_host(
        box,
        f'mkdir -p "$HOME/.fleet/run/big" && {python} - "$HOME/.fleet/run/big/vllm.log" {SIZE}',
        stdin=_generator(),
    )
    total = int(on_host(box, 'wc -l < "$HOME/.fleet/run/big/vllm.log"').strip())
    size = int(on_host(box, 'wc -c < "$HOME/.fleet/run/big/vllm.log"').strip())
    assert SIZE - 2**20 < size <= SIZE

    res = fleet(box, "--json", "logs", "--host", host.name, "big", "--diagnose")
    assert res.returncode == 1, res.stderr
    full = json.loads(res.stdout)
    doc = full["hosts"][host.name]
    ids = [d["id"] for d in doc["diagnoses"]]
    assert ids[:3] == ["cuda-oom", "worker-died", "engine-dead"]
    # the contract (docs/contracts.md): one ranked top-level list, each entry naming its host
    assert [d["id"] for d in full["diagnoses"]][:1] == ["cuda-oom"]
    assert {d["host"] for d in full["diagnoses"]} == {host.name}
    assert len(full["diagnoses"]) == len(ids) and doc["truncated"] is False
    assert doc["file_size"] == size
    assert 0 < doc["bytes_received"] < 0.01 * size
    # evidence cites the real line numbers of the file on the host
    oom = doc["diagnoses"][0]["evidence"][0]
    assert total - 10 < oom["line"] <= total
    line = on_host(box, f"sed -n '{oom['line']}p' \"$HOME/.fleet/run/big/vllm.log\"")
    assert line.rstrip("\n").endswith(oom["text"])

    # the people's view says how much was fetched
    human = fleet(box, "logs", "--host", host.name, "big", "--diagnose")
    assert human.returncode == 1
    assert "cuda-oom" in human.stdout and "fetched" in human.stdout

    # --tail keeps real line numbers too
    tail = fleet(box, "--json", "logs", "--host", host.name, "big", "--diagnose", "--tail", "2")
    tdoc = json.loads(tail.stdout)["hosts"][host.name]
    assert [d["id"] for d in tdoc["diagnoses"]] == ["worker-died", "engine-dead"]
    assert tdoc["diagnoses"][0]["evidence"][0]["line"] == total - 1
    on_host(box, 'rm -f "$HOME/.fleet/run/big/vllm.log"')


@pytest.mark.docker
def test_clean_and_missing_logs(box: Sandbox) -> None:
    name = box.hosts[0].name
    write_log(
        box,
        "clean",
        "INFO 11-02 10:14:01 [a.py:1] vLLM API server version 0.17.0\n"
        "(APIServer pid=1) INFO:     Application startup complete.\n",
    )
    res = fleet(box, "--json", "logs", "--host", name, "clean", "--diagnose")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["hosts"][name]["diagnoses"] == []
    missing = fleet(box, "--json", "logs", "--host", name, "nope", "--diagnose")
    assert missing.returncode == 1
    entry = json.loads(missing.stdout)["hosts"][name]
    assert entry["ok"] is False and "cannot read" in entry["error"]
    shown = fleet(box, "logs", "--host", name, "clean", "--tail", "1")
    assert shown.returncode == 0
    assert shown.stdout.strip().endswith("Application startup complete.")


@pytest.mark.docker
def test_hostile_path_is_quoted(box: Sandbox) -> None:
    name = box.hosts[0].name
    weird = "we ird 'q\" ; $(touch PWNED1) `touch PWNED2` | touch PWNED3 & #.log"
    on_host(
        box,
        f"cat > {shlex.quote('/tmp/' + weird)}",
        stdin="RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method\n",
    )
    res = fleet(box, "--json", "logs", "--host", name, "--path", "/tmp/" + weird, "--diagnose")
    assert res.returncode == 1, res.stderr
    diag = json.loads(res.stdout)["hosts"][name]["diagnoses"][0]
    assert diag["id"] == "cuda-reinit-in-fork"
    assert diag["fix"] == "VLLM_WORKER_MULTIPROC_METHOD=spawn"
    assert on_host(box, "ls PWNED1 PWNED2 PWNED3 /tmp/PWNED* 2>/dev/null || true").strip() == ""
    on_host(box, f"rm -f {shlex.quote('/tmp/' + weird)}")


def test_port_in_use_names_the_holder(box: Sandbox) -> None:
    name = box.hosts[0].name
    python = shlex.quote(box.hosts[0].python)
    listener = (
        "import socket, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "print(s.getsockname()[1], flush=True)\n"
        "time.sleep(120)\n"
    )
    out = on_host(
        box,
        f'f=$(mktemp); cat > "$f"; nohup {python} "$f" > "$f.port" 2>/dev/null & '
        f'echo $!; sleep 1; cat "$f.port"',
        stdin=listener,
    )
    pid, port = out.split()[:2]
    try:
        write_log(
            box,
            "port",
            f"ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', {port}): address already in use\n",
        )
        res = fleet(box, "--json", "logs", "--host", name, "port", "--diagnose")
        diag = json.loads(res.stdout)["hosts"][name]["diagnoses"][0]
        assert diag["id"] == "port-in-use"
        assert f"Port {port} is already in use" in diag["summary"]
        if diag["values"].get("holder_pid") or on_host(box, "command -v ss || true").strip():
            assert diag["values"]["holder_pid"] == pid
            assert diag["fix"] == f"kill {pid}"
        else:
            assert diag["fix"] == f"ss -ltnp 'sport = :{port}'"
    finally:
        on_host(box, f"kill {int(pid)} 2>/dev/null || true")


def test_follow_diagnoses_lines_as_they_arrive(box: Sandbox) -> None:
    name = box.hosts[0].name
    write_log(box, "live", "INFO 11-02 10:14:01 [a.py:1] vLLM API server version 0.17.0\n")
    proc = subprocess.Popen(
        [*box.fleet_argv(), "--json", "logs", "--host", name, "live", "--follow", "--diagnose"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=box.fleet_env(),
    )
    try:
        time.sleep(2.0)
        on_host(
            box,
            'cat >> "$HOME/.fleet/run/live/vllm.log"',
            stdin="(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.\n",
        )
        deadline = time.monotonic() + 60
        found: dict[str, Any] | None = None
        assert proc.stdout is not None
        while time.monotonic() < deadline and found is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                if line.strip():
                    found = json.loads(line)
        assert found is not None, "no diagnosis streamed"
        assert found["host"] == name
        assert found["diagnosis"]["id"] == "kv-cache-no-memory"
        assert found["diagnosis"]["evidence"][0]["line"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _read_json_lines(
    proc: subprocess.Popen[str], count: int, seconds: float = 60
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and data.count(b"\n") < count:
        if select.select([fd], [], [], 1.0)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode().splitlines()[:count]:
        out.append(json.loads(line))
    return out


SECRET = "sk-remotesecret0123456789abcdef"


def test_follow_json_without_diagnose_prints_each_line(box: Sandbox) -> None:
    name = box.hosts[0].name
    write_log(box, "live2", "first line\nsecond line with api_key=" + SECRET + "\n")
    proc = subprocess.Popen(
        [*box.fleet_argv(), "--json", "logs", "--host", name, "live2", "--follow", "--tail", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=box.fleet_env(),
    )
    try:
        got = _read_json_lines(proc, 2)  # type: ignore[arg-type]
        on_host(box, 'cat >> "$HOME/.fleet/run/live2/vllm.log"', stdin="third line\n")
        got += _read_json_lines(proc, 1)  # type: ignore[arg-type]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert got == [
        {"host": name, "line": 1, "text": "first line"},
        {"host": name, "line": 2, "text": "second line with api_key=***"},
        {"host": name, "line": 3, "text": "third line"},
    ]


@pytest.mark.docker
def test_pathological_log_is_capped_and_secrets_masked(box: Sandbox) -> None:
    """Every line matches the prefilter: at most the byte cap crosses the network, the end
    of the log is still diagnosed, and the API key in vLLM's args line is never shown."""
    from fleet.diagnosis.host_logs import output_cap

    host = box.hosts[0]
    python = shlex.quote(host.python)
    args = (
        "(APIServer pid=1) INFO 11-02 10:14:05 [utils.py:238] non-default args: "
        f"{{'model': '/m', 'api_key': ['{SECRET}'], 'port': 8001}}"
    )
    kv = (
        "(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] ValueError: No available memory "
        "for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
    )
    gen = (
        "import sys\n"
        "oom = '(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. #'\n"
        "with open(sys.argv[1], 'w') as fh:\n"
        f"    fh.write({args!r} + '\\n')\n"
        "    for n in range(120000):\n"
        "        fh.write(oom + str(n) + '\\n')\n"
        f"    fh.write({args!r} + '\\n' + {kv!r} + '\\n')\n"
    )
    on_host(
        box,
        f'mkdir -p "$HOME/.fleet/run/all" && {python} - "$HOME/.fleet/run/all/vllm.log"',
        stdin=gen,
    )
    size = int(on_host(box, 'wc -c < "$HOME/.fleet/run/all/vllm.log"').strip())
    assert size > 3 * output_cap()
    res = fleet(box, "--json", "logs", "--host", host.name, "all", "--diagnose")
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)["hosts"][host.name]
    assert doc["bytes_received"] <= output_cap() + 4096
    assert doc["truncated"] is True and doc["notes"]
    ids = [d["id"] for d in doc["diagnoses"]]
    assert "kv-cache-no-memory" in ids and "cuda-oom" in ids
    kv_diag = doc["diagnoses"][ids.index("kv-cache-no-memory")]
    assert kv_diag["evidence"][0]["line"] == 120003
    assert any("'api_key': ['***']" in e["text"] for e in kv_diag["context"])
    assert SECRET not in res.stdout
    human = fleet(box, "-v", "logs", "--host", host.name, "all", "--diagnose")
    assert human.returncode == 1 and "kv-cache-no-memory" in human.stdout
    assert SECRET not in human.stdout
    on_host(box, 'rm -f "$HOME/.fleet/run/all/vllm.log"')

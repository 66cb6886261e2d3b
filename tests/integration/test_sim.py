"""The rehearsal vLLM on a real sandbox host: ``vllm serve`` over SSH.

The host is a real sshd (fleet.sandbox); the command goes through fleet's transport
(``Session`` + ``HostConnection``), its text made only by ``fleet.transport.shell``. From
this machine the test sees what an operator sees: connection refused on the host's
``vllm_port`` while the weights load, ``/health`` 200 once ``Application startup
complete.`` is in the log, the processes' titles on the host, the GPU memory the
host's nvidia-smi reports, and the knobs of ``Sandbox.set_sim``.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

import pytest

from fleet.diagnosis import diagnose
from fleet.errors import UsageError
from fleet.inventory import load_inventory
from fleet.sandbox.core import Sandbox
from fleet.transport import HostConnection, Session, shell

pytestmark = [pytest.mark.integration, pytest.mark.docker]  # also in the docker stage

# A constant template: every value is quoted by shell.script (paths with the ~/ rule).
START = (
    "nohup {{vllm}} serve {{model}} --tensor-parallel-size 8 --served-model-name kimi-k2.5 "
    "--port {{port}} --speculative-config {{spec}} > {{log}} 2>&1 < /dev/null & echo $!"
)
LOG = "~/rehearsal-serve.log"
TITLES = (
    'e=$(pgrep -P {{pid}}); for p in $e $(pgrep -P "$e"); '
    "do tr '\\0' '\\n' < /proc/$p/cmdline | head -n 1; done"
)
STOP_ALL = (
    'for f in ~/.fleet-sandbox/run/vllm-*.pid; do [ -f "$f" ] && kill "$(cat "$f")"; done; true'
)


@pytest.fixture(scope="module")
def box(sandbox_factory: Any) -> Sandbox:
    return sandbox_factory(1, ("0.18.0",), load_seconds=3.0, name="sim")


@pytest.fixture()
def host(box: Sandbox) -> Iterator[tuple[Any, HostConnection]]:
    inventory = load_inventory(str(box.inventory_path))
    spec = inventory.hosts[box.hosts[0].name]
    with Session(inventory) as session:
        conn = session.connect(spec)
        yield spec, conn
        conn.run(shell.sh(STOP_ALL))
    box.set_sim(spec.name)


def start(spec: Any, conn: HostConnection) -> int:
    models = str(spec.vars["models_dir"])
    vllm = str(PurePosixPath(spec.python).parent / "vllm")
    drafter = {
        "method": "eagle3",
        "model": f"{models}/Kimi-K25-eagle3",
        "num_speculative_tokens": 3,
    }
    script = shell.script(
        START,
        vllm=shell.RemotePath(vllm),
        model=shell.RemotePath(f"{models}/Kimi-K2.5"),
        port=int(spec.vars["vllm_port"]),
        spec=json.dumps(drafter),
        log=shell.RemotePath(LOG),
    )
    res = conn.run(shell.sh(script), timeout=30)
    assert res.ok, res.stderr
    return int(res.stdout.strip())


def log_of(conn: HostConnection) -> str:
    return conn.run(shell.sh(shell.script("cat {{log}}", log=shell.RemotePath(LOG)))).stdout


def refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(5)
        try:
            sock.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        except ConnectionResetError:  # taken into a listener's queue as it closed: not yet
            return False
    return False


def health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_inventory_vars_lead_to_the_checkpoints(
    box: Sandbox, host: tuple[Any, HostConnection]
) -> None:
    spec, conn = host
    models = str(spec.vars["models_dir"])
    res = conn.run(["ls", models])
    assert res.stdout.split() == [
        "DeepSeek-V3",
        "DeepSeek-V3-eagle3",
        "Kimi-K2-Instruct",
        "Kimi-K2.5",
        "Kimi-K25-eagle3",
        "mismatched-eagle3",
    ]
    config = json.loads(conn.run(["cat", f"{models}/Kimi-K2.5/config.json"]).stdout)
    text = config["text_config"]
    assert (text["hidden_size"], text["num_hidden_layers"], text["vocab_size"]) == (
        7168,
        61,
        163840,
    )
    assert text["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] == 4
    listing = shell.script(
        "ls {{dir}} | grep -c 'safetensors$'", dir=shell.RemotePath(f"{models}/Kimi-K2.5")
    )
    shards = conn.run(shell.sh(listing)).stdout
    assert int(shards) == 64
    assert (
        conn.run([str(PurePosixPath(spec.python).parent / "vllm"), "--version"]).stdout.strip()
        == "0.18.0"
    )


def test_serve_over_ssh_refused_while_loading_then_healthy(
    box: Sandbox, host: tuple[Any, HostConnection]
) -> None:
    spec, conn = host
    port = int(spec.vars["vllm_port"])
    pid = start(spec, conn)
    deadline = time.monotonic() + 60
    while "Loading safetensors checkpoint shards" not in log_of(conn):
        assert time.monotonic() < deadline, log_of(conn)
        time.sleep(0.1)
    # during the load: the port is bound, not listening
    assert refused(port)
    # the server's own children: the EngineCore, and its workers (the host is shared)
    titles = conn.run(shell.sh(shell.script(TITLES, pid=pid))).stdout.split()
    assert titles[0] == "VLLM::EngineCore"
    assert sorted(titles[1:]) == [f"VLLM::Worker_TP{k}" for k in range(8)]
    smi = conn.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    ).stdout.split()
    assert len(smi) == 8 and all(int(v) > 0 for v in smi)
    while "Application startup complete." not in log_of(conn):
        assert time.monotonic() < deadline, log_of(conn)
        time.sleep(0.1)
    assert health(port) == 200
    assert diagnose(log_of(conn).replace("\r\n", "\n").split("\n")) == []
    conn.run(["kill", "-TERM", str(pid)])
    while not refused(port):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert log_of(conn).rstrip().endswith("INFO:     Application shutdown complete.")
    smi = conn.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    ).stdout.split()
    assert smi == ["0"] * 8


def test_knobs_are_read_at_start(box: Sandbox, host: tuple[Any, HostConnection]) -> None:
    spec, conn = host
    with pytest.raises(UsageError, match="unknown rehearsal vLLM knob"):
        box.set_sim(spec.name, no_such_knob=1)
    box.set_sim(spec.name, fault="oom", load_seconds=1.0)
    start(spec, conn)
    deadline = time.monotonic() + 60
    while "Engine core initialization failed" not in log_of(conn):
        assert time.monotonic() < deadline, log_of(conn)
        time.sleep(0.1)
    found = diagnose(log_of(conn).replace("\r\n", "\n").split("\n"))
    assert found[0].id == "cuda-oom"
    assert box.gpu_state(spec.name).get("processes") == []

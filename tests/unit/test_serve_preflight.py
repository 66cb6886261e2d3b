"""Preflight rules on observations (pure), and the on-host preflight on real vLLM trees."""

# ruff: noqa: E501  (observation tables)

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.inventory import HostSpec
from fleet.serving.preflight import judge
from fleet.serving.profile import for_host

HOST = HostSpec(name="h1", address="10.0.0.1", python="/env/bin/python", vars={"models_dir": "/m"})
PROFILE = for_host("kimi-eagle3", HOST)
GPU_CSV = "".join(f"{i}, NVIDIA B200, 183359, 0, 570.133.20\n" for i in range(8))
TARGET = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61,
                    "vocab_size": 163840, "num_attention_heads": 64,
                    "max_position_embeddings": 262144},
}  # fmt: skip
DRAFTER = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 7168,
           "vocab_size": 163840, "draft_vocab_size": 32000,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}  # fmt: skip
SUPPORTED = {"files": {"model_executor/models/kimi_k25.py": {"classes": {
    "KimiK25ForConditionalGeneration": {"line": 1, "bases": ["nn.Module", "SupportsEagle3"],
                                        "methods": ["set_aux_hidden_state_layers"]}}}}}  # fmt: skip


def model(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "path": "/m/x",
        "exists": True,
        "config": {"value": config},
        "weights": {"indexed": ["a.safetensors"], "present": ["a.safetensors"], "missing": []},
    }


GOOD: dict[str, Any] = {
    "home": "/root",
    "vllm": {"path": "/env/vllm", "version": "0.18.0", "models": SUPPORTED,
             "allowlist": {"found": [{"file": "config/speculative.py", "name": "aux_hidden_states_supported",
                                       "line": 9, "entries": ["llama", "kimi_k2"]}]},
             "knows": {"LlamaForCausalLMEagle3": True, "llama": True}},
    "target": model(TARGET),
    "drafter": model(DRAFTER),
    "gpus": {"exit_code": 0, "stdout": GPU_CSV, "stderr": ""},
    "port": {"free": True},
    "disk": {"home": {"path": "/root", "total": 10**13, "used": 0, "free": 10**12}},
    "vllm_executable": {"path": "/env/bin/vllm", "ok": True},
    "server": {"program": {"state": "STOPPED"}},
}  # fmt: skip


def ids(observed: dict[str, Any]) -> list[str]:
    return [d.id for d in judge(PROFILE, observed, host="h1").diagnoses]


def test_a_good_host_passes() -> None:
    assert ids(GOOD) == []


def with_(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    where: Any = doc
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split("|")]
    for key in keys[:-1]:
        where = where[key]
    where[keys[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("vllm|models|files|model_executor/models/kimi_k25.py|classes|KimiK25ForConditionalGeneration|bases",
         ["nn.Module", "SupportsEagle"], "eagle3-unsupported-model"),
        ("vllm|allowlist|found|0|entries", ["llama", "qwen"], "eagle3-target-not-allowlisted"),
        ("gpus|stdout", GPU_CSV.replace(", 0, 570", ", 150000, 570"), "gpu-memory-utilization-too-high"),
        ("gpus|stdout", "".join(GPU_CSV.splitlines(True)[:4]), "tp-size-invalid"),
        ("gpus", {"missing": True}, "no-gpu-visible"),
        ("drafter|config|value|hidden_size", 4096, "drafter-incompatible"),
        ("drafter|config|value|vocab_size", 129280, "drafter-incompatible"),
        ("drafter|config|value|eagle_config|eagle_aux_hidden_state_layer_ids", [2, 30, 61], "drafter-incompatible"),
        ("vllm|knows|LlamaForCausalLMEagle3", False, "drafter-incompatible"),
        ("target|weights|missing", ["a.safetensors"], "checkpoint-corrupt"),
        ("drafter|exists", False, "model-not-found"),
        ("port", {"free": False, "error": "Address already in use", "holder": "vllm (pid 7)"}, "port-in-use"),
        ("disk|home|free", 10**8, "disk-full"),
    ],
)  # fmt: skip
def test_each_problem_is_its_diagnosis(path: str, value: Any, expected: str) -> None:
    found = judge(PROFILE, with_(path, value), host="h1")
    assert expected in [d.id for d in found.diagnoses]
    d = next(d for d in found.diagnoses if d.id == expected)
    assert d.evidence and d.evidence[0].text.startswith("preflight: ")
    if expected.startswith("eagle3"):
        assert d.fix == "fleet patch --host h1"


def test_the_observations_of_a_real_017_tree_predict_the_eagle3_crash(tmp_path: Path) -> None:
    """The on-host preflight reads the installed source: an unpatched 0.17.0 is refused."""
    from fleet.sandbox.vllm_source import vllm_tree
    from fleet.serving import host_calls
    from fleet.transport import LocalRunner

    target, drafter = tmp_path / "Kimi-K2.5", tmp_path / "Kimi-K25-eagle3"
    import json

    for d, cfg in ((target, TARGET), (drafter, DRAFTER)):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"w": "a.safetensors"}})
        )
        (d / "a.safetensors").write_bytes(b"")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(vllm_tree("0.17.0"))}
    conn = LocalRunner(
        HostSpec(name="h1", python=sys.executable, vars={"models_dir": str(tmp_path)}), env=env
    )
    profile = for_host("kimi-eagle3", conn.host).model_copy(update={"port": 0})
    observed = host_calls.preflight(conn, profile)
    found = [d.id for d in judge(profile, observed.model_dump(), host="h1").diagnoses]
    assert "eagle3-target-not-allowlisted" in found and "eagle3-unsupported-model" in found
    assert "no-gpu-visible" in found  # this machine has no nvidia-smi


def test_the_port_check_sees_a_bound_socket_but_not_time_wait() -> None:
    """vLLM binds long before it listens: a bound socket is "in use"; the TIME_WAIT
    connections a stopped server leaves behind are not (vLLM binds with SO_REUSEADDR)."""
    import socket

    from fleet.onhost.serve import _bind_free

    bound = socket.socket()
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    bound.bind(("127.0.0.1", 0))  # bound, not listening: a loading vLLM
    port = bound.getsockname()[1]
    assert _bind_free("127.0.0.1", port)["free"] is False
    bound.listen()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = bound.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT
    client.close()
    bound.close()
    answer = _bind_free("127.0.0.1", port)
    assert answer["free"] is True and "TIME_WAIT" in answer.get("note", "")


def test_status_lists_only_fleets_run_directories(tmp_path: Path, monkeypatch: Any) -> None:
    """A stray directory in ~/.fleet/run (a name fleet serve refuses) is no profile: it
    is skipped, not a refusal of the whole status."""
    from fleet.onhost import serve as onhost_serve

    monkeypatch.setenv("HOME", str(tmp_path))
    run = tmp_path / ".fleet" / "run"
    (run / "kimi-eagle3").mkdir(parents=True)
    (run / "Not A Profile").mkdir()
    (run / ("x" * 80)).mkdir()
    out = onhost_serve.op_status({"names": [], "metrics": False})
    assert list(out["profiles"]) == ["kimi-eagle3"]

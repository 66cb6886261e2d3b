"""The pure facts parsers, on recorded outputs (tests/fixtures/facts/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet.facts.models import EAGLE3_CLASSES
from fleet.facts.parsers import (
    FactsError,
    eagle3_support,
    gpu_summary,
    parse_allowlist,
    parse_disk,
    parse_facts,
    parse_gpu_part,
    parse_nvidia_smi,
    parse_servers,
    parse_supervisors,
    server_args,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def fixture_json(name: str) -> Any:
    return json.loads(fixture_text(name))


# -- nvidia-smi -------------------------------------------------------------------------


def test_b200_idle() -> None:
    gpus = parse_nvidia_smi(fixture_text("nvidia-smi/b200x8-idle.csv"))
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA B200"}
    assert {g.memory_total_mib for g in gpus} == {183359}
    assert {g.memory_used_mib for g in gpus} == {0}
    assert {g.driver_version for g in gpus} == {"570.133.20"}
    assert gpu_summary(gpus) == "8 × NVIDIA B200 (179 GiB)"


def test_h100_busy_memory_used_per_gpu() -> None:
    gpus = parse_nvidia_smi(fixture_text("nvidia-smi/h100x8-half-busy.csv"))
    assert [g.memory_used_mib for g in gpus] == [74312, 74312, 74298, 74298, 3, 3, 3, 3]
    assert gpu_summary(gpus) == "8 × NVIDIA H100 80GB HBM3 (80 GiB)"


def test_not_available_values_become_none() -> None:
    (gb10,) = parse_nvidia_smi(fixture_text("nvidia-smi/gb10-unified-memory-na.csv"))
    assert gb10.name == "NVIDIA GB10"
    assert gb10.memory_total_mib is None and gb10.memory_used_mib is None
    assert gb10.driver_version == "580.95.05"
    assert gpu_summary([gb10]) == "1 × NVIDIA GB10"

    vgpu, v100 = parse_nvidia_smi(fixture_text("nvidia-smi/vgpu-not-supported.csv"))
    assert (vgpu.name, vgpu.memory_total_mib, vgpu.memory_used_mib) == (
        "GRID A100D-40C",
        40960,
        None,
    )
    assert (v100.name, v100.memory_used_mib) == ("Tesla V100-SXM2-32GB", 0)
    assert gpu_summary([vgpu, v100]) == (
        "1 × GRID A100D-40C (40 GiB) + 1 × Tesla V100-SXM2-32GB (32 GiB)"
    )


def test_unusual_names_are_kept_whole() -> None:
    gpus = parse_nvidia_smi(fixture_text("nvidia-smi/odd-names.csv"))
    assert [g.name for g in gpus] == [
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA Graphics Device",
        "Acme, Inc. Accelerator (rev 2)",
    ]
    assert gpus[3].memory_total_mib == 16384 and gpus[3].memory_used_mib == 12


def test_header_and_units_tolerated() -> None:
    (l4,) = parse_nvidia_smi(fixture_text("nvidia-smi/with-header-and-units.csv"))
    assert (l4.index, l4.name, l4.memory_total_mib) == (0, "NVIDIA L4", 23034)
    assert l4.memory_used_mib == 0


@pytest.mark.parametrize("line", ["0, NVIDIA B200, 183359", "zero, a, 1, 2, 3"])
def test_malformed_lines_are_errors(line: str) -> None:
    with pytest.raises(FactsError):
        parse_nvidia_smi(line + "\n")


def test_gpu_part_missing_is_not_an_error() -> None:
    assert parse_gpu_part(fixture_json("nvidia-smi/missing.json")) == ([], "missing", None)


def test_gpu_part_driver_not_loaded_is_a_failure_with_its_message() -> None:
    gpus, status, error = parse_gpu_part(fixture_json("nvidia-smi/driver-not-loaded.json"))
    assert gpus == [] and status == "failed"
    assert error is not None and error.startswith("nvidia-smi exited 9: NVIDIA-SMI has failed")


def test_gpu_part_no_devices_is_zero_gpus() -> None:
    assert parse_gpu_part(fixture_json("nvidia-smi/no-devices.json")) == ([], "ok", None)


def test_gpu_part_ok() -> None:
    raw = {"exit_code": 0, "stdout": fixture_text("nvidia-smi/b200x8-idle.csv"), "stderr": ""}
    gpus, status, error = parse_gpu_part(raw)
    assert (len(gpus), status, error) == (8, "ok", None)


def test_gpu_summary_empty() -> None:
    assert gpu_summary([]) == "no GPUs"


# -- EAGLE-3: inheritance followed within the file --------------------------------------


def cls(*bases: str, methods: tuple[str, ...] = (), line: int = 1) -> dict[str, Any]:
    return {"bases": list(bases), "methods": list(methods), "attributes": [], "line": line}


def test_direct_base() -> None:
    classes = {"A": cls("nn.Module", "SupportsPP", "SupportsEagle3")}
    info = eagle3_support(classes, "A", "f.py")
    assert info.supported and info.via == ["A"] and info.file == "f.py"


def test_through_in_file_base_chain() -> None:
    classes = {
        "Mixin": cls("interfaces.SupportsEagle3", methods=("set_aux_hidden_state_layers",)),
        "V2": cls("nn.Module", "Mixin"),
        "V3": cls("V2"),
    }
    info = eagle3_support(classes, "V3")
    assert info.supported and info.via == ["V3", "V2", "Mixin"]
    assert info.forwards_aux_hidden_state_layers


def test_supports_eagle_alone_is_not_eagle3() -> None:
    classes = {"V2": cls("nn.Module", "SupportsEagle"), "V3": cls("V2")}
    assert not eagle3_support(classes, "V3").supported


def test_bases_outside_the_file_are_not_followed() -> None:
    # `other.V2` names a class of another module: not followed even if a same-named
    # class here would qualify
    classes = {"V2": cls("SupportsEagle3"), "V3": cls("other.V2"), "V4": cls("Imported")}
    assert not eagle3_support(classes, "V3").supported
    assert not eagle3_support(classes, "V4").supported


def test_inheritance_cycle_terminates() -> None:
    classes = {"A": cls("B"), "B": cls("A")}
    assert not eagle3_support(classes, "A").supported


# -- the config-time allowlist ----------------------------------------------------------


def test_allowlist_011_shape_refuses_deepseek_and_kimi() -> None:
    raw = {
        "searched": ["config/speculative.py"],
        "found": [
            {
                "file": "config/speculative.py",
                "name": "eagle3_target_supported",
                "line": 540,
                "entries": ["llama", "qwen", "minicpm", "gpt_oss"],
            }
        ],
    }
    allow = parse_allowlist(raw)
    assert allow.present and allow.name == "eagle3_target_supported"
    assert not allow.deepseek and not allow.kimi
    assert allow.admits == {
        "deepseek_v2": False,
        "deepseek_v3": False,
        "kimi_k2": False,
        "kimi_k25": False,
    }


def test_allowlist_substring_semantics() -> None:
    # vLLM tests `entry in model_type`: "deepseek" admits every deepseek_* type, "kimi_k2"
    # also admits "kimi_k25"
    raw = {
        "found": [
            {
                "file": "f",
                "name": "aux_hidden_states_supported",
                "line": 1,
                "entries": ["deepseek", "kimi_k2"],
            }
        ]
    }
    allow = parse_allowlist(raw)
    assert allow.admits == {
        "deepseek_v2": True,
        "deepseek_v3": True,
        "kimi_k2": True,
        "kimi_k25": True,
    }
    raw["found"][0]["entries"] = ["deepseek_v3"]
    allow = parse_allowlist(raw)
    assert allow.deepseek and not allow.kimi
    assert not allow.admits["deepseek_v2"]


def test_no_allowlist_admits_everything() -> None:
    allow = parse_allowlist({"searched": ["config/speculative.py"], "found": []})
    assert not allow.present and allow.deepseek and allow.kimi


def test_allowlist_not_a_literal_list() -> None:
    raw = {
        "found": [{"file": "f", "name": "aux_hidden_states_supported", "line": 3, "entries": None}]
    }
    allow = parse_allowlist(raw)
    assert allow.present and allow.entries is None and not allow.deepseek


# -- supervisors, servers, disk ---------------------------------------------------------


def test_supervisors() -> None:
    sup = parse_supervisors(
        {
            "pid1": "systemd",
            "systemd_booted": True,
            "tools": {
                "systemctl": "/usr/bin/systemctl",
                "supervisord": "/env/bin/supervisord",
                "supervisorctl": "/env/bin/supervisorctl",
            },
        }
    )
    assert sup.systemd and sup.available == ["systemd", "supervisord"]
    # in a container systemctl may exist while PID 1 is something else
    sup = parse_supervisors(
        {
            "pid1": "tini",
            "systemd_booted": False,
            "tools": {
                "systemctl": "/usr/bin/systemctl",
                "supervisord": None,
                "supervisorctl": None,
            },
        }
    )
    assert not sup.systemd and sup.available == []


def test_servers_from_recorded_processes() -> None:
    raw = fixture_json("processes/serving.json")
    servers = {s.pid: s for s in parse_servers(raw["processes"])}
    assert sorted(servers) == [4100, 6000, 7000, 7100]
    kimi = servers[4100]
    assert (kimi.model, kimi.port, kimi.uid) == ("/models/Kimi-K2.5-INT4", 8001, 1000)
    assert kimi.descendants == ["VLLM::EngineCore"] + [f"VLLM::Worker_TP{i}" for i in range(8)]
    legacy = servers[6000]
    assert (legacy.model, legacy.port, legacy.host) == ("deepseek-ai/DeepSeek-V3", 8000, "0.0.0.0")
    assert servers[7000].model is None and servers[7000].port is None
    assert (servers[7100].model, servers[7100].port) == ("Qwen/Qwen3-8B", 8100)


API_KEY = "sk-fleetfacts0123456789abcdef"
HF_TOKEN = "hf_fleetFactsToken0123456789ABCDEFG"


def cmdline_sample() -> list[dict[str, Any]]:
    """/proc/PID/cmdline as the facts script reads it (NUL-separated, split), for a server
    started with its API key on the command line."""
    words = [
        "/opt/ml-env/bin/python3",
        "/opt/ml-env/bin/vllm",
        "serve",
        "/models/Kimi-K2.5",
        "--port",
        "8001",
        "--api-key",
        API_KEY,
        f"--hf-token={HF_TOKEN}",
        "--tokenizer",
        "/models/tok",
    ]
    raw = b"\0".join(w.encode() for w in words) + b"\0"
    argv = [a.decode() for a in raw.rstrip(b"\0").split(b"\0")]
    return [
        {"pid": 10, "ppid": 1, "uid": 1000, "argv": argv},
        {"pid": 11, "ppid": 10, "uid": 1000, "argv": [f"VLLM::EngineCore --api-key={API_KEY}"]},
    ]


def test_server_argv_is_redacted() -> None:
    (server,) = parse_servers(cmdline_sample())
    assert (server.model, server.port) == ("/models/Kimi-K2.5", 8001)
    assert server.argv[server.argv.index("--api-key") + 1] == "***"
    assert "--hf-token=***" in server.argv
    assert server.argv[-2:] == ["--tokenizer", "/models/tok"]  # not a secret
    doc = json.dumps(server.model_dump(mode="json"))
    assert API_KEY not in doc and HF_TOKEN not in doc
    facts = parse_facts(
        {
            "schema": 1,
            "parts": {"processes": {"value": {"processes": cmdline_sample(), "uid": 1000}}},
        }
    )
    doc = json.dumps(facts.model_dump(mode="json"))
    assert API_KEY not in doc and HF_TOKEN not in doc


@pytest.mark.parametrize(
    "argv",
    [
        ["grep", "vllm"],
        ["bash", "-c", "vllm serve x"],
        ["/opt/vllm/bin/python", "-"],
        ["VLLM::Worker_TP0"],
        ["vllm"],
    ],
)
def test_not_servers(argv: list[str]) -> None:
    assert server_args(argv) is None


def test_disk() -> None:
    disk, errors = parse_disk(
        {
            "home": {"path": "/home/u", "total": 100, "used": 60, "free": 40},
            "vllm": {"path": "/opt/env/vllm", "error": "PermissionError: denied"},
        }
    )
    assert disk["home"].free_bytes == 40 and "vllm" not in disk
    assert errors == {"disk:vllm": "PermissionError: denied"}


# -- the whole document -----------------------------------------------------------------


def test_document_with_a_failed_part() -> None:
    parts = {
        "host": {"value": {"hostname": "b200-01"}},
        "python": {"value": {"version": "3.12.3", "executable": "/env/bin/python"}},
        "vllm": {"value": {"path": "/env/vllm", "version": "0.17.0"}},
        "models": {
            "value": {
                "files": {
                    "model_executor/models/deepseek_v2.py": {
                        "classes": {
                            "DeepseekV2ForCausalLM": cls("nn.Module", "SupportsEagle"),
                            "DeepseekV3ForCausalLM": cls("DeepseekV2ForCausalLM"),
                        }
                    },
                    "model_executor/models/kimi_k25.py": {"missing": True},
                }
            }
        },
        "allowlist": {"error": "SyntaxError: invalid syntax (speculative.py, line 3)"},
        "gpus": {
            "value": {
                "exit_code": 0,
                "stdout": fixture_text("nvidia-smi/b200x8-idle.csv"),
                "stderr": "",
            }
        },
        "supervisors": {"value": {"pid1": "systemd", "systemd_booted": True, "tools": {}}},
        "processes": {"value": {"processes": []}},
        "disk": {"value": {"home": {"path": "/h", "total": 3, "used": 1, "free": 2}}},
    }
    facts = parse_facts({"parts": parts})
    assert facts.hostname == "b200-01" and facts.python == "3.12.3"
    assert facts.vllm.installed and facts.vllm.version == "0.17.0"
    assert facts.vllm.eagle3 == {
        "DeepseekV2ForCausalLM": False,
        "DeepseekV3ForCausalLM": False,
        "KimiK25ForConditionalGeneration": None,  # the class does not exist in this file set
    }
    assert list(facts.vllm.eagle3) == list(EAGLE3_CLASSES)
    assert facts.vllm.eagle3_allowlist is None
    assert facts.errors == {"allowlist": "SyntaxError: invalid syntax (speculative.py, line 3)"}
    assert len(facts.gpus) == 8 and facts.driver == "570.133.20" and facts.nvidia_smi == "ok"


def test_vllm_not_installed() -> None:
    facts = parse_facts({"schema": 1, "parts": {"vllm": {"value": {"path": None}}}})
    assert not facts.vllm.installed and facts.vllm.eagle3 == {}


@pytest.mark.parametrize(("version", "supported"), [("0.17.0", False), ("0.18.0", True)])
def test_recorded_sandbox_documents(version: str, supported: bool) -> None:
    facts = parse_facts(fixture_json(f"documents/sandbox-{version}.json"))
    assert facts.errors == {}
    assert facts.vllm.version == version
    assert facts.vllm.eagle3 == {cls: supported for cls in EAGLE3_CLASSES}
    assert facts.vllm.eagle3_allowlist is not None
    assert facts.vllm.eagle3_allowlist.deepseek is supported
    assert gpu_summary(facts.gpus) == "8 × NVIDIA B200 (179 GiB)"
    assert not facts.supervisors.systemd  # recorded in a container: PID 1 is not systemd


@pytest.mark.parametrize("odd", ["²", "٣", "１２", "99999", "0", "-1", "8000 "])
def test_odd_port_is_no_port_not_a_failed_host(odd: str) -> None:
    procs = [{"pid": 5, "ppid": 1, "uid": 0, "argv": ["vllm", "serve", "M", "--port", odd]}]
    (server,) = parse_servers(procs)
    assert server.port is None and server.model == "M"


def test_an_odd_part_lands_in_its_own_error() -> None:
    doc = fixture_json("documents/sandbox-0.18.0.json")
    doc["parts"]["disk"] = {"value": {"home": {"path": "/h", "total": "lots", "used": 1}}}
    odd_process = {"pid": "x", "argv": ["vllm", "serve"]}
    doc["parts"]["processes"] = {"value": {"processes": [odd_process, 7]}}
    facts = parse_facts(doc)
    assert facts.errors == {
        "disk:home": "unexpected disk usage data from the host",
        "processes": "2 process entries could not be understood",
    }
    assert facts.vllm.version == "0.18.0" and len(facts.gpus) == 8

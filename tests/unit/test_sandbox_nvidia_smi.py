"""The nvidia-smi stand-in: nvidia-smi's formats, driven by the host's JSON files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.onhost.rehearsal import nvidia_smi
from fleet.sandbox.local import install_nvidia_smi


@pytest.fixture
def config() -> dict[str, object]:
    return nvidia_smi.load_config(home="/nonexistent-home")


def test_default_is_eight_b200(config: dict[str, object]) -> None:
    code, out = nvidia_smi.run(
        ["--query-gpu=index,name,memory.total,memory.used", "--format=csv,noheader"], config
    )
    assert code == 0
    rows = [line.split(", ") for line in out.splitlines()]
    assert len(rows) == 8
    assert rows[0] == ["0", "NVIDIA B200", "183359 MiB", "0 MiB"]
    assert [r[0] for r in rows] == [str(i) for i in range(8)]


def test_header_and_nounits(config: dict[str, object]) -> None:
    code, out = nvidia_smi.run(
        ["--query-gpu", "index,memory.total,power.limit,driver_version", "--format=csv,nounits"],
        config,
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "index, memory.total [MiB], power.limit [W], driver_version"
    assert lines[1] == "0, 183359, 1000.00, 570.133.20"
    assert len(lines) == 9


def test_units_follow_values(config: dict[str, object]) -> None:
    _, out = nvidia_smi.run(
        ["--query-gpu=utilization.gpu,power.draw,clocks.max.sm", "--format=csv,noheader"], config
    )
    util, power, clock = out.splitlines()[0].split(", ")
    assert util == "0 %"
    assert power.endswith(" W") and float(power[:-2]) > 0
    assert clock == "1965 MHz"


def test_unknown_field_and_bad_format(config: dict[str, object]) -> None:
    code, out = nvidia_smi.run(["--query-gpu=index,bogus", "--format=csv"], config)
    assert code == 2
    assert out.startswith('Field "bogus" is not a valid field to query.')
    code, out = nvidia_smi.run(["--query-gpu=index", "--format=json"], config)
    assert code == 2 and "Invalid combination" in out
    code, _ = nvidia_smi.run(["--query-gpu=index"], config)
    assert code == 2
    code, _ = nvidia_smi.run(["--frobnicate"], config)
    assert code == 2


def test_select_gpus_with_i(config: dict[str, object]) -> None:
    code, out = nvidia_smi.run(
        ["-i", "3,5", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], config
    )
    assert code == 0
    assert out.splitlines() == ["3, 00000000:5D:00.0", "5, 00000000:AB:00.0"]
    code, out = nvidia_smi.run(["--id=9", "--query-gpu=index", "--format=csv"], config)
    assert code == 6 and "No devices were found" in out


def test_list_gpus_has_distinct_uuids(config: dict[str, object]) -> None:
    code, out = nvidia_smi.run(["-L"], config)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 8
    assert lines[0].startswith("GPU 0: NVIDIA B200 (UUID: GPU-")
    assert len({line.split("UUID: ")[1] for line in lines}) == 8


def test_summary_table(config: dict[str, object]) -> None:
    code, out = nvidia_smi.run([], config)
    assert code == 0
    assert "Driver Version: 570.133.20" in out and "CUDA Version: 12.8" in out
    assert out.count("NVIDIA B200") == 8
    assert "No running processes found" in out
    table = [line for line in out.splitlines() if line.startswith(("|", "+"))]
    assert len({len(line) for line in table}) == 1  # every row the same width


def _home(tmp_path: Path, host: dict[str, object], state: dict[str, object] | None) -> str:
    base = tmp_path / ".fleet-sandbox"
    base.mkdir(parents=True)
    (base / "host.json").write_text(json.dumps(host))
    if state is not None:
        (base / "gpu-state.json").write_text(json.dumps(state))
    return str(tmp_path)


def test_host_and_workload_files_drive_the_output(tmp_path: Path) -> None:
    home = _home(
        tmp_path,
        {
            "host": "sandbox-02",
            "gpu_count": 4,
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "memory_total_mib": 81559,
        },
        {
            "memory_used_mib": [70000, 70000],
            "utilization_gpu": [90],
            "processes": [
                {"pid": 4242, "name": "python3", "gpus": [0, 1], "used_memory_mib": 69000}
            ],
        },
    )
    config = nvidia_smi.load_config(home=home)
    _, out = nvidia_smi.run(
        [
            "--query-gpu=index,name,memory.used,memory.free,utilization.gpu",
            "--format=csv,noheader,nounits",
        ],
        config,
    )
    assert out.splitlines() == [
        "0, NVIDIA H100 80GB HBM3, 70000, 11559, 90",
        "1, NVIDIA H100 80GB HBM3, 70000, 11559, 0",
        "2, NVIDIA H100 80GB HBM3, 0, 81559, 0",
        "3, NVIDIA H100 80GB HBM3, 0, 81559, 0",
    ]
    _, apps = nvidia_smi.run(
        ["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"], config
    )
    assert apps.splitlines() == ["4242, python3, 69000 MiB", "4242, python3, 69000 MiB"]
    _, table = nvidia_smi.run([], config)
    assert "4242" in table and "No running processes found" not in table


def test_broken_state_files_fall_back_to_defaults(tmp_path: Path) -> None:
    base = tmp_path / ".fleet-sandbox"
    base.mkdir()
    (base / "host.json").write_text("{not json")
    (base / "gpu-state.json").write_text('["a list"]')
    config = nvidia_smi.load_config(home=str(tmp_path))
    code, out = nvidia_smi.run(["--query-gpu=name", "--format=csv,noheader"], config)
    assert code == 0 and out.splitlines() == ["NVIDIA B200"] * 8


def test_no_apps_means_empty_output_or_header_only(config: dict[str, object]) -> None:
    assert nvidia_smi.run(["--query-compute-apps=pid", "--format=csv,noheader"], config) == (0, "")
    assert nvidia_smi.run(["--query-compute-apps=pid,used_memory", "--format=csv"], config) == (
        0,
        "pid, used_gpu_memory [MiB]\n",
    )


def test_installed_launcher_runs_with_the_given_python(tmp_path: Path) -> None:
    """The file installed on a host works on its own (stdlib only), from any directory."""
    home = tmp_path / "home with space"
    launcher = install_nvidia_smi(home, python=sys.executable)
    res = subprocess.run(
        [str(launcher), "--query-gpu=index,name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        cwd="/",
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[7] == "7, NVIDIA B200"
    bad = subprocess.run(
        [str(launcher), "--query-gpu=nope", "--format=csv"],
        capture_output=True,
        text=True,
        env={"HOME": str(home)},
        check=False,
    )
    assert bad.returncode == 2

"""``fleet inspect`` output, built from HostOutcome values (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.cli.cmd_inspect import allowlist_cell, eagle3_cell, inspect_json, render_outcomes
from fleet.facts.models import (
    Eagle3Allowlist,
    GpuInfo,
    HostFacts,
    VllmFacts,
    VllmServer,
)
from fleet.facts.parsers import parse_facts
from fleet.transport import HostOutcome


def facts(version: str, supported: bool) -> HostFacts:
    eagle3: dict[str, bool | None] = {
        "DeepseekV2ForCausalLM": supported,
        "DeepseekV3ForCausalLM": supported,
        "KimiK25ForConditionalGeneration": supported,
    }
    return HostFacts(
        hostname="gpu-01",
        python="3.12.3",
        vllm=VllmFacts(
            installed=True,
            version=version,
            path="/env/vllm",
            eagle3=eagle3,
            eagle3_allowlist=Eagle3Allowlist(present=True, deepseek=supported, kimi=supported),
        ),
        gpus=[
            GpuInfo(index=i, name="NVIDIA B200", memory_total_mib=183359, memory_used_mib=0)
            for i in range(8)
        ],
        driver="570.133.20",
        nvidia_smi="ok",
        servers=[VllmServer(pid=42, argv=["vllm", "serve", "m", "--port", "8000"], port=8000)],
    )


OUTCOMES: list[HostOutcome[HostFacts]] = [
    HostOutcome("b200-01", "ok", value=facts("0.17.0", False)),
    HostOutcome("b200-02", "ok", value=facts("0.18.0", True)),
    HostOutcome("b200-03", "unreachable", error="cannot connect to 10.0.0.13:22: refused"),
    HostOutcome("b200-04", "failed", error="python interpreter '/x' not found", hint="set python"),
]


def test_json_contract() -> None:
    doc = json.loads(json.dumps(inspect_json(OUTCOMES)))
    assert list(doc) == ["hosts"]
    ok = doc["hosts"]["b200-01"]
    assert ok["ok"] is True
    assert ok["vllm"]["version"] == "0.17.0" and ok["vllm"]["path"] == "/env/vllm"
    assert ok["vllm"]["eagle3"] == {
        "DeepseekV2ForCausalLM": False,
        "DeepseekV3ForCausalLM": False,
        "KimiK25ForConditionalGeneration": False,
    }
    assert ok["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA B200",
        "memory_total_mib": 183359,
        "memory_used_mib": 0,
        "driver_version": None,
    }
    assert ok["python"] == "3.12.3"
    assert doc["hosts"]["b200-02"]["vllm"]["eagle3"]["KimiK25ForConditionalGeneration"] is True
    assert doc["hosts"]["b200-03"] == {
        "ok": False,
        "changed": False,
        "status": "unreachable",
        "code": None,
        "error": "cannot connect to 10.0.0.13:22: refused",
    }
    assert doc["hosts"]["b200-04"]["ok"] is False and doc["hosts"]["b200-04"]["hint"]


def test_json_round_trips_into_the_model() -> None:
    entry = inspect_json(OUTCOMES[:1])["hosts"]["b200-01"]
    entry.pop("ok")
    assert HostFacts.model_validate(entry) == OUTCOMES[0].value


@pytest.mark.parametrize("details", [False, True])
def test_render_for_people(
    details: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleet.cli.render as render

    monkeypatch.setenv("COLUMNS", "160")
    render_outcomes(render.make_console(), OUTCOMES, details)
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith("b200")}
    assert "0.17.0" in rows["b200-01"] and "✗ ✗ ✗" in rows["b200-01"]
    assert "0.18.0" in rows["b200-02"] and "✓ ✓ ✓" in rows["b200-02"]
    assert "unreachable" in rows["b200-03"] and "failed" in rows["b200-04"]
    assert out.count("8 × NVIDIA B200 (179 GiB)") == (4 if details else 2)
    assert "b200-03: cannot connect to 10.0.0.13:22: refused" in out
    assert "next: set python" in out
    assert ("pid 42 port 8000" in out) is details


def test_cells() -> None:
    f = facts("0.17.0", False)
    assert eagle3_cell(f) == "[red]✗[/] [red]✗[/] [red]✗[/]"
    f.vllm.eagle3["KimiK25ForConditionalGeneration"] = None
    assert eagle3_cell(f).endswith("[dim]–[/]")
    f.vllm.eagle3_allowlist = Eagle3Allowlist(present=True, deepseek=True, kimi=False)
    assert allowlist_cell(f) == "deepseek only"
    f.vllm.eagle3_allowlist = Eagle3Allowlist(present=False, deepseek=True, kimi=True)
    assert "no check" in allowlist_cell(f)
    assert eagle3_cell(parse_facts({"schema": 1, "parts": {}})) == "-"


def test_inspect_unknown_host_is_usage_error(tmp_path: Path) -> None:
    from fleet.cli import cli
    from fleet.cli.errors import run_cli

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  hosts:\n    h1: {address: 127.0.0.1}\n")
    assert run_cli(cli, ["--inventory", str(inventory), "inspect", "--host", "nope"]) == 2


def test_host_strings_are_not_markup(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names, versions, GPU names, paths and errors come from hosts: printed literally."""
    import fleet.cli.render as render

    monkeypatch.setenv("COLUMNS", "200")
    f = facts("[/x]", True)
    f.hostname = "[/hostname]"
    f.vllm.path = "/env/[/path]\\"
    f.gpus = [GpuInfo(index=0, name="[/bold]GPU\\", memory_total_mib=1024)]
    f.driver = "[red]570"
    f.errors = {"disk:home": "[/err]"}
    outcomes: list[HostOutcome[HostFacts]] = [
        HostOutcome("[/x]", "ok", value=f),
        HostOutcome("[/down]", "failed", error="[/red] boom\\", hint="[/dim]"),
    ]
    render_outcomes(render.make_console(), outcomes, True)
    out = capsys.readouterr().out
    for literal in (
        "[/x]",
        "[/hostname]",
        "/env/[/path]",
        "[/bold]GPU",
        "[red]570",
        "[/err]",
        "[/down]: [/red] boom",
        "next: [/dim]",
    ):
        assert literal in out, literal


def test_no_secret_in_inspect_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleet.cli.render as render

    secret = "sk-inspectsecret0123456789abc"
    argv = ["/env/bin/vllm", "serve", "/models/m", "--port", "8000", "--api-key", secret]
    doc = {
        "schema": 1,
        "parts": {"processes": {"value": {"processes": [{"pid": 5, "argv": argv}], "uid": 0}}},
    }
    parsed = parse_facts(doc)
    assert parsed.servers[0].port == 8000
    outcomes = [HostOutcome("h", "ok", value=parsed)]
    assert secret not in json.dumps(inspect_json(outcomes))
    monkeypatch.setenv("COLUMNS", "200")
    render_outcomes(render.make_console(), outcomes, True)
    out = capsys.readouterr().out
    assert "pid 5 port 8000" in out and secret not in out

"""``fleet logs`` as a real process: local files, JSON contract, exit codes, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "logs"
KV_LOG = CORPUS / "kv-cache-too-small--kv-v1--v1.log"


def fleet(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="120")
    env.pop("FLEET_INVENTORY", None)
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
        check=False,
    )


def test_diagnose_local_file_json_contract() -> None:
    res = fleet("--json", "logs", "--file", str(KV_LOG), "--diagnose")
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    first = doc["diagnoses"][0]
    assert first["id"] == "kv-cache-too-small"
    assert first["severity"] == "fatal"
    assert first["fix"] == "--max-model-len 148592"
    assert {"line", "text"} <= set(first["evidence"][0])
    lines = KV_LOG.read_text().splitlines()
    assert lines[first["evidence"][0]["line"] - 1].endswith(first["evidence"][0]["text"])
    assert isinstance(first["remedy"], str) and first["remedy"]


def test_diagnose_local_file_for_people() -> None:
    res = fleet("logs", "--file", str(KV_LOG), "--diagnose")
    assert res.returncode == 1
    assert "kv-cache-too-small" in res.stdout
    assert "--max-model-len 148592" in res.stdout
    assert "engine-init-failed" in res.stdout  # ranked after the cause


def test_clean_file_exits_zero(tmp_path: Path) -> None:
    log = tmp_path / "ok.log"
    log.write_text(
        "(APIServer pid=1) INFO 11-02 10:14:01 [a.py:1] vLLM API server version 0.17.0\n"
        "(APIServer pid=1) INFO:     Application startup complete.\n"
    )
    res = fleet("--json", "logs", "--file", str(log), "--diagnose")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["diagnoses"] == []
    res = fleet("logs", "--file", str(log), "--diagnose")
    assert res.returncode == 0
    assert "no problems found" in res.stdout


def test_tail_limits_the_diagnosed_lines() -> None:
    res = fleet("--json", "logs", "--file", str(KV_LOG), "--diagnose", "--tail", "3")
    ids = [d["id"] for d in json.loads(res.stdout)["diagnoses"]]
    assert ids == ["engine-init-failed"]
    assert res.returncode == 1


def test_show_local_file_tail() -> None:
    res = fleet("logs", "--file", str(KV_LOG), "--tail", "2")
    assert res.returncode == 0
    assert res.stdout.splitlines() == KV_LOG.read_text().splitlines()[-2:]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cases = [
        ("logs", "--file", str(tmp_path / "missing.log"), "--diagnose"),
        ("logs", "--file", str(KV_LOG), "--host", "x", "--diagnose"),
        ("logs", "--diagnose"),
        ("logs", "--host", "x", "--diagnose"),
        ("logs", "--host", "x", "../etc", "--diagnose"),
        ("logs", "--host", "x", "p", "--path", "/tmp/x.log"),
        ("logs", "--file", str(KV_LOG), "--follow"),
        ("logs", "--file", str(KV_LOG), "--tail", "0"),
    ]
    for args in cases:
        res = fleet(*args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr
        assert 1 <= len(res.stderr.strip().splitlines()) <= 4, res.stderr


# --------------------------------------------------------------------------- secrets


SECRET = "sk-fleettest0123456789abcdef"


def secret_log(tmp_path: Path) -> Path:
    """The KV log with an API key in vLLM's args line and in two error lines (one long)."""
    lines = KV_LOG.read_text().splitlines()
    lines[1] = lines[1].replace("'port': 8001", f"'port': 8001, 'api_key': ['{SECRET}']")
    assert SECRET in lines[1]
    ctx = "(APIServer pid=1100) ERROR 11-02 10:15:01 [api_server.py:9] "
    lines[2:2] = [
        f"{ctx}RuntimeError: refused to start: --api-key {SECRET} is not accepted",
        f"{ctx}ValueError: bad config {'x' * 20000} api_key={SECRET}",
    ]
    # the args line again, right before the first match of another rule (its context)
    lines += [
        lines[1],
        "(EngineCore_DP0 pid=1201) ERROR 11-02 10:15:02 [core.py:708] ValueError: No available "
        "memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
    ]
    log = tmp_path / "secret.log"
    log.write_text("\n".join(lines) + "\n")
    return log


def test_no_secret_in_diagnosis_output(tmp_path: Path) -> None:
    log = secret_log(tmp_path)
    res = fleet("--json", "logs", "--file", str(log), "--diagnose")
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    ids = [d["id"] for d in doc["diagnoses"]]
    assert ids[0] == "kv-cache-too-small" and "unrecognized-error" in ids
    assert SECRET not in res.stdout
    # the key is masked, the rest of the evidence is kept
    unrec = next(d for d in doc["diagnoses"] if d["id"] == "unrecognized-error")
    assert "--api-key ***" in unrec["evidence"][0]["text"]
    assert "--api-key ***" in unrec["summary"]
    context = [e["text"] for d in doc["diagnoses"] for e in d["context"]]
    assert any("'api_key': ['***']" in t for t in context), context
    for args in (("-v",), ()):
        human = fleet(*args, "logs", "--file", str(log), "--diagnose")
        assert human.returncode == 1
        assert SECRET not in human.stdout and "kv-cache-too-small" in human.stdout
    # showing the log masks it too
    shown = fleet("logs", "--file", str(log), "--tail", "40")
    assert shown.returncode == 0 and "'api_key': ['***']" in shown.stdout
    assert SECRET not in shown.stdout
    shown = fleet("--json", "logs", "--file", str(log), "--tail", "40")
    assert SECRET not in shown.stdout


# --------------------------------------------------------------------------- many hosts


def _remote(host: str, log: Path, diagnoses: list[Any]) -> Any:
    from fleet.diagnosis.host_logs import RemoteDiagnosis

    return RemoteDiagnosis(host=host, path=str(log), diagnoses=diagnoses)


def test_hosts_json_has_one_ranked_diagnoses_list() -> None:
    from fleet.cli.cmd_logs import hosts_json
    from fleet.diagnosis import diagnose_text
    from fleet.diagnosis.models import SEVERITY_ORDER
    from fleet.transport import HostOutcome

    per_host = {
        "a": diagnose_text((CORPUS / "port-in-use--port-socket--v1.log").read_bytes(), host="a"),
        "b": diagnose_text(KV_LOG.read_bytes(), host="b"),
        "c": diagnose_text((CORPUS / "cuda-oom--oom-torch--v1.log").read_bytes(), host="c"),
    }
    assert all(len(d) >= 1 for d in per_host.values())
    outcomes = [HostOutcome(h, "ok", value=_remote(h, KV_LOG, d)) for h, d in per_host.items()]
    outcomes.append(HostOutcome("down", "unreachable", error="refused"))
    doc = json.loads(json.dumps(hosts_json(outcomes)))
    # the per-host map stays
    assert set(doc["hosts"]) == {"a", "b", "c", "down"}
    assert [d["id"] for d in doc["hosts"]["b"]["diagnoses"]] == [d.id for d in per_host["b"]]
    # the contract list: every diagnosis of every host, with its host
    flat = doc["diagnoses"]
    assert sorted((d["host"], d["id"]) for d in flat) == sorted(
        (h, d.id) for h, ds in per_host.items() for d in ds
    )
    # primaries first (ranked by severity), then the others by severity, then host rank
    primaries = {(h, ds[0].id) for h, ds in per_host.items()}
    n = len(primaries)
    assert {(d["host"], d["id"]) for d in flat[:n]} == primaries
    sev = [SEVERITY_ORDER[d["severity"]] for d in flat]
    assert sev[:n] == sorted(sev[:n]) and sev[n:] == sorted(sev[n:])
    rank = {(h, d.id): i for h, ds in per_host.items() for i, d in enumerate(ds)}
    for x, y in zip(flat[n:], flat[n + 1 :], strict=False):
        if x["severity"] == y["severity"]:
            assert rank[(x["host"], x["id"])] <= rank[(y["host"], y["id"])]
    for d in flat:
        assert {"id", "severity", "summary", "evidence", "remedy", "fix", "host"} <= set(d)


# --------------------------------------------------------------------------- markup


def test_host_strings_are_not_rich_markup(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    import fleet.cli.render as render
    from fleet.cli.cmd_logs import _render_outcome, render_diagnoses
    from fleet.diagnosis import diagnose_text
    from fleet.transport import HostOutcome

    monkeypatch.setenv("COLUMNS", "200")
    out_console = render.make_console()
    evil = "[/x]"
    log = tmp_path / "l.log"
    log.write_text(
        "(APIServer pid=1) ERROR 11-02 10:15:01 [a.py:1] RuntimeError: [/bold] at [red]x[/red] \\\n"
    )
    diags = diagnose_text(log.read_bytes(), host=evil)
    assert diags
    ok = _remote(evil, log, diags)
    ok.path = "/tmp/[/]x\\"
    ok.notes.append("[/note]")
    _render_outcome(out_console, evil, ok)
    render.failure_lines(
        out_console, [HostOutcome(evil, "failed", error="[/red] boom \\", hint="[/dim]")]
    )
    render_diagnoses(out_console, diags * 2, where=evil, lines=None)
    render_diagnoses(out_console, [], where=evil + "\\", lines=3)
    out = capsys.readouterr().out
    assert f"{evil}: [/red] boom" in out
    assert "[/bold] at [red]x[/red]" in out and "/tmp/[/]x" in out and "[/note]" in out

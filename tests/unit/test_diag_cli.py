"""``fleet logs`` as a real process: local files, JSON contract, exit codes, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "logs"
KV_LOG = CORPUS / "kv-cache-too-small--kv-v1--v1.log"


def fleet(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="120")
    env.pop("FLEET_INVENTORY", None)
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args], capture_output=True, text=True,
        timeout=120, env=env, cwd=cwd, check=False,
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
    log.write_text("(APIServer pid=1) INFO 11-02 10:14:01 [a.py:1] vLLM API server version 0.17.0\n"
                   "(APIServer pid=1) INFO:     Application startup complete.\n")
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

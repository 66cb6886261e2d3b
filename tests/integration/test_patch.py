"""``fleet patch`` against real sshd hosts holding real vLLM trees of several versions.

Every check of a host's files goes through its own Python over a separate SSH
connection (sha256 of each target file, backup directory present or not), never
through fleet's patch code, so the tests observe what really is on the host. Which vLLM
is "the installed one" is the on-host runtime's single answer (``find_vllm`` of
``fleet/onhost/_common.py``, bundled in front of the probe).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.inventory import load_inventory
from fleet.onhost import client
from fleet.patching.manifest import load_patch_set
from fleet.sandbox.core import Sandbox
from fleet.transport import Session
from tests.versions import PATCH_HOSTS

pytestmark = pytest.mark.integration

VERSIONS = PATCH_HOSTS
PATHS = [f.path for f in load_patch_set().manifest.files]
DS = "model_executor/models/deepseek_v2.py"

# Runs on the host with its own interpreter: package dir, sha256 of each target file,
# the fleet backup directory of the patch set, and fleet temp files next to the targets.
PROBE = r"""
import glob, hashlib, json, os, sys
pkg = find_vllm()
out = {"package_dir": pkg, "files": {}, "temps": []}
for rel in sys.argv[1:]:
    p = os.path.join(pkg, *rel.split("/"))
    if os.path.exists(p):
        out["files"][rel] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    else:
        out["files"][rel] = None
    temps = "." + os.path.basename(p) + ".fleet-tmp-*"
    out["temps"] += glob.glob(os.path.join(os.path.dirname(p), temps))
root = os.path.expanduser("~/.fleet/patches/eagle3-deepseek")
out["backups"] = sorted(os.listdir(root)) if os.path.isdir(root) else None
print(json.dumps(out))
"""


def probe(box: Sandbox) -> dict[str, dict[str, Any]]:
    inv = load_inventory(str(box.inventory_path))
    out: dict[str, dict[str, Any]] = {}
    with Session(inv) as session:
        for spec in inv.select(["all"]):
            conn = session.connect(spec)
            script = client.bundle("_common").text + PROBE
            res = conn.run([spec.python, "-", *PATHS], stdin=script, timeout=60).check("probe")
            out[spec.name] = json.loads(res.stdout)
    return out


def shas(box: Sandbox) -> dict[str, dict[str, str | None]]:
    return {h: p["files"] for h, p in probe(box).items()}


def run_json(box: Sandbox, *args: str, code: int = 0) -> dict[str, Any]:
    proc = box.run_fleet("--json", "patch", *args)
    assert proc.returncode == code, proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc["hosts"]


def statuses(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {h: {f["path"]: f["status"] for f in r["files"]} for h, r in doc.items()}


def by_version(box: Sandbox) -> dict[str, str]:
    return {h.name: h.vllm for h in box.hosts}


@pytest.mark.sandbox(hosts=6, vllm=VERSIONS)
@pytest.mark.docker
def test_apply_again_revert_apply_across_versions(sandbox: Sandbox) -> None:
    versions = by_version(sandbox)
    original = shas(sandbox)
    assert all(p["backups"] is None for p in probe(sandbox).values())

    # --check and --diff write nothing: same sha256, no backup directory
    checked = run_json(sandbox, "--host", "all", "--check")
    assert all(r["ok"] for r in checked.values())
    for host, files in statuses(checked).items():
        if versions[host] == "0.18.0":
            assert set(files.values()) == {"not-needed"}
        else:
            assert files[DS] == "would-apply"
            assert ("would-apply" in files.values()) and "applied" not in files.values()
    diff = sandbox.run_fleet("patch", "--host", "all", "--diff")
    assert diff.returncode == 0, diff.stderr
    assert f"--- a/vllm/{DS}" in diff.stdout and "+class DeepseekV2ForCausalLM(" in diff.stdout
    after_dry = probe(sandbox)
    assert {h: p["files"] for h, p in after_dry.items()} == original
    assert all(p["backups"] is None for p in after_dry.values())

    # apply: the JSON contract, and the hosts really carry the planned sha256; every host
    # was read, planned and written through one connection and ONE remote process
    marks = sandbox.log_marks()
    applied = run_json(sandbox, "--host", "all")
    assert remote_work(sandbox, marks) == {h.name: (1, 1) for h in sandbox.hosts}
    now = shas(sandbox)
    for host, report in applied.items():
        assert report["ok"] is True and report["vllm_version"] == versions[host]
        for f in report["files"]:
            assert set(f) >= {"path", "status", "sha256_before", "sha256_after"}
            assert f["sha256_before"] == original[host][f["path"]]
            assert f["sha256_after"] == now[host][f["path"]]
            if versions[host] == "0.18.0":
                assert f["status"] == "not-needed"
        if versions[host] != "0.18.0":
            assert statuses(applied)[host][DS] == "applied"
            assert now[host][DS] != original[host][DS]
    assert now[_host_of(versions, "0.18.0")] == original[_host_of(versions, "0.18.0")]
    kimi = "model_executor/models/kimi_k25.py"
    assert statuses(applied)[_host_of(versions, "0.13.0")][kimi] == "not-needed"
    assert statuses(applied)[_host_of(versions, "0.15.0")][kimi] == "applied"

    # fleet inspect now sees EAGLE-3 support on every host
    inspected = json.loads(sandbox.run_fleet("--json", "inspect", "--host", "all").stdout)
    for host, facts in inspected["hosts"].items():
        assert facts["vllm"]["eagle3"]["DeepseekV3ForCausalLM"] is True, host

    # apply again: already-applied, nothing changes, exit 0
    again = run_json(sandbox, "--host", "all")
    assert shas(sandbox) == now
    for host, files in statuses(again).items():
        assert set(files.values()) <= {"already-applied", "not-needed"}
        assert (versions[host] == "0.18.0") or ("already-applied" in files.values())

    # revert: byte-identical originals, backups gone (one process per host again)
    marks = sandbox.log_marks()
    reverted = run_json(sandbox, "--host", "all", "--revert")
    assert remote_work(sandbox, marks) == {h.name: (1, 1) for h in sandbox.hosts}
    assert shas(sandbox) == original
    assert all(p["backups"] is None for p in probe(sandbox).values())
    for host, files in statuses(reverted).items():
        want = "not-needed" if versions[host] == "0.18.0" else "reverted"
        assert files[DS] == want

    # and apply once more
    run_json(sandbox, "--host", "all")
    assert shas(sandbox) == now


def remote_work(box: Sandbox, marks: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Per host, since ``marks``: (SSH connections accepted, sessions started), as sshd
    logged them (every remote command is one session)."""
    out = {}
    for h in box.hosts:
        log = box.sshd_log(h.name)[marks[h.name] :]
        out[h.name] = (log.count("Accepted publickey"), log.count("Starting session: "))
    return out


def _host_of(versions: dict[str, str], version: str) -> str:
    return next(h for h, v in versions.items() if v == version)


SED_HAND_PATCH = (
    "s/for layer in islice(self.layers, self.start_layer, self.end_layer):/"
    "for i, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer)):/"
)


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",))
def test_hand_edited_host_gets_a_conflict_and_keeps_its_files(sandbox: Sandbox) -> None:
    edited, other = (h.name for h in sandbox.hosts)
    inv = load_inventory(str(sandbox.inventory_path))
    pkg = probe(sandbox)[edited]["package_dir"]
    with Session(inv) as session:
        spec = inv.select([edited])[0]
        session.connect(spec).run(["sed", "-i", SED_HAND_PATCH, f"{pkg}/{DS}"], timeout=30).check(
            "sed"
        )
    before = shas(sandbox)
    proc = sandbox.run_fleet("patch", "--host", "all")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{edited}: conflict: {DS} [edit model-loop in DeepseekV2Model.forward]" in proc.stdout
    assert "enumerate(islice(self.layers, self.start_layer, self.end_layer))" in proc.stdout
    assert f"nothing was written on {edited}" in proc.stdout
    after = probe(sandbox)
    assert after[edited]["files"] == before[edited]  # every file of that host kept
    assert after[edited]["backups"] is None
    assert after[other]["files"][DS] != before[other][DS]  # the other host was patched

    doc = run_json(sandbox, "--host", edited, code=1)
    conflict = next(f for f in doc[edited]["files"] if f["status"] == "conflict")
    assert conflict["path"] == DS and conflict["conflict"]["edit"] == "model-loop"
    assert conflict["conflict"]["candidates"][0]["text"].strip().startswith("for i, layer in")
    assert doc[edited]["ok"] is False


# (fault point, how many of the files to write are patched when the script is killed there)
CUTS = [
    ("after-backup", "none"),
    ("after-temp", "none"),
    ("after-first-rename", "one"),
    ("after-rename", "all"),
]


@pytest.mark.sandbox(hosts=1, vllm=("0.15.0",))
@pytest.mark.parametrize(("point", "how_many"), CUTS, ids=[c[0] for c in CUTS])
@pytest.mark.docker
def test_connection_cut_during_apply(sandbox: Sandbox, point: str, how_many: str) -> None:
    """sshd and the write script are SIGKILLed while the script pauses at ``point``."""
    (host,) = (h.name for h in sandbox.hosts)
    original = shas(sandbox)[host]
    planned = {
        f["path"]: f["sha256_after"]
        for f in run_json(sandbox, "--host", "all", "--check")[host]["files"]
    }
    to_write = [p for p in planned if planned[p] != original[p]]
    assert len(to_write) > 1, "the cut points need several files to write"
    n_patched = {"none": 0, "one": 1, "all": len(to_write)}[how_many]
    env = sandbox.fleet_env()
    cmd = [
        sys.executable,
        "-m",
        "tests.faults",
        f"{point}:sleep=30",
        "--",
        "--inventory",
        str(sandbox.inventory_path),
        "--json",
        "patch",
        "--host",
        "all",
    ]
    fleet = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_pause(sandbox, point, original, planned, len(to_write))
        sandbox.kill_host(host)
        out, err = fleet.communicate(timeout=60)
    finally:
        if fleet.poll() is None:
            fleet.kill()
    assert fleet.returncode == 3, out + err
    assert json.loads(out)["hosts"][host]["status"] == "unreachable"

    sandbox.start_host(host)
    now = shas(sandbox)[host]
    patched = [p for p in now if now[p] != original[p]]
    for path, sha in now.items():
        assert sha in (original[path], planned[path]), f"{path} half-written"
    assert len(patched) == n_patched, patched

    # the next run completes the job (and cleans temp files); revert restores all
    done = run_json(sandbox, "--host", "all")[host]
    assert done["ok"] and shas(sandbox)[host] == planned
    assert probe(sandbox)[host]["temps"] == []
    assert {f["status"] for f in done["files"]} <= {"applied", "already-applied", "not-needed"}
    run_json(sandbox, "--host", "all", "--revert")
    assert shas(sandbox)[host] == original


def _wait_for_pause(
    box: Sandbox,
    point: str,
    original: dict[str, str | None],
    planned: dict[str, str | None],
    n_write: int,
) -> None:
    """Wait, observing the host over SSH, until the write script sits at ``point``
    (``n_write``: how many files the plan writes, one temp file each)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        p = next(iter(probe(box).values()))
        changed = [f for f in p["files"] if p["files"][f] != original[f]]
        reached = {
            "after-backup": bool(p["backups"]),
            "after-temp": len(p["temps"]) == n_write,
            "after-first-rename": len(changed) == 1,
            "after-rename": len(changed) == n_write
            and all(p["files"][f] == planned[f] for f in changed),
        }[point]
        if reached:
            time.sleep(0.2)
            return
        time.sleep(0.1)
    raise AssertionError(f"the write script never reached {point}")


@pytest.mark.sandbox(hosts=3, vllm=("0.16.0", "0.18.0"))
def test_unreachable_host_and_bad_input(sandbox: Sandbox) -> None:
    down = sandbox.hosts[0].name
    sandbox.stop_host(down)
    proc = sandbox.run_fleet("--json", "patch", "--host", "all")
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)["hosts"]
    assert doc[down]["ok"] is False and doc[down]["status"] == "unreachable"
    assert all(doc[h.name]["ok"] for h in sandbox.hosts[1:])

    bad = sandbox.run_fleet("patch", "--host", "all", "--patch", "no-such-set")
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "unknown patch set" in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stdout == ""
    force = sandbox.run_fleet("patch", "--host", "all", "--force")
    assert force.returncode == 2 and "--revert" in force.stderr


@pytest.mark.sandbox(hosts=1, vllm=("0.17.0",))
def test_revert_refuses_changed_file_unless_forced(sandbox: Sandbox) -> None:
    (host,) = (h.name for h in sandbox.hosts)
    original = shas(sandbox)[host]
    run_json(sandbox, "--host", "all")
    pkg = probe(sandbox)[host]["package_dir"]
    inv = load_inventory(str(sandbox.inventory_path))
    with Session(inv) as session:
        conn = session.connect(inv.select([host])[0])
        conn.run(
            ["sh", "-c", f"echo '# local tweak' >> {pkg}/config/speculative.py"], timeout=30
        ).check("append")
    tweaked = shas(sandbox)[host]
    refused = run_json(sandbox, "--host", "all", "--revert", code=1)[host]
    assert statuses({host: refused})[host]["config/speculative.py"] == "conflict"
    assert shas(sandbox)[host] == tweaked  # nothing reverted
    forced = run_json(sandbox, "--host", "all", "--revert", "--force")[host]
    assert forced["ok"] and shas(sandbox)[host] == original


@pytest.mark.docker
def test_check_on_the_shared_fleet(shared_sandbox: Sandbox) -> None:
    """Read-only: the sandbox trees cannot even be imported (no torch); --check never
    tries, and reports the 0.17 hosts as would-apply, the 0.18 host as not-needed."""
    doc = run_json(shared_sandbox, "--host", "all", "--check")
    for host in shared_sandbox.hosts:
        files = statuses(doc)[host.name]
        want = "not-needed" if host.vllm == "0.18.0" else "would-apply"
        assert files[DS] == want


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",))
def test_a_home_relative_python_is_run_as_inspect_runs_it(sandbox: Sandbox, tmp_path: Path) -> None:
    """``python: ~/ml-env/bin/python`` in the inventory names the host's home: patch,
    like inspect and source, lets the host's shell expand it (not a quoted literal '~')."""
    tilde, plain = (h.name for h in sandbox.hosts)
    data = yaml.safe_load(sandbox.inventory_path.read_text())
    hosts = data["all"]["children"]["sandbox"]["hosts"]
    hosts[tilde]["python"] = "~/ml-env/bin/python"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(data))
    original = shas(sandbox)

    def fleet(*args: str, code: int = 0) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "fleet", "--inventory", str(inventory), "--json", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=sandbox.fleet_env(),
            check=False,
        )
        assert proc.returncode == code, proc.stdout + proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc["hosts"]

    inspected = fleet("inspect", "--host", "all")
    assert inspected[tilde]["vllm"]["version"] == "0.17.0"  # inspect reads it this way too
    applied = fleet("patch", "--host", "all")
    assert applied[tilde]["ok"] is True and applied[tilde]["vllm_version"] == "0.17.0"
    assert statuses(applied)[tilde] == statuses(applied)[plain]
    now = shas(sandbox)
    assert now[tilde][DS] != original[tilde][DS] and now[tilde] == now[plain]
    reverted = fleet("patch", "--host", tilde, "--revert")
    assert reverted[tilde]["ok"] is True and shas(sandbox)[tilde] == original[tilde]

    hosts[tilde]["python"] = "~/no-such-env/bin/python"
    inventory.write_text(yaml.safe_dump(data))
    missing = fleet("patch", "--host", tilde, "--check", code=1)[tilde]
    assert missing["status"] == "failed" and missing["vllm_version"] is None
    assert "python interpreter '~/no-such-env/bin/python' not found" in missing["error"]

"""The docker-sshd hosts themselves: what they hold, what `down` leaves, the image cache.

These run only on the docker backend (``scripts/test-docker.sh``, or
``FLEET_SANDBOX_BACKEND=docker``). Every check of a host goes through OpenSSH's own client
(strict host keys) or the Docker engine, never through the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from openssh_client import ssh

from fleet.sandbox import docker
from fleet.sandbox.core import Sandbox, default_backend
from fleet.sandbox.vllm_source import vllm_tree

pytestmark = [
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.skipif(
        default_backend() != "docker",
        reason="docker backend only (scripts/test-docker.sh, or FLEET_SANDBOX_BACKEND=docker)",
    ),
]


def engine(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=120, check=False
    )


def recorded_container(box: Sandbox, name: str) -> str:
    return (box.dir / "hosts" / name / "container").read_text().strip()


# Runs on the host with the host's own Python: sha256 of every file of the vLLM tree.
TREE_DIGEST = r"""
import hashlib, importlib.util, json, os, sys
pkg = list(importlib.util.find_spec("vllm").submodule_search_locations)[0]
site = os.path.dirname(pkg)
out = {"site": site, "files": {}}
for top in sorted(os.listdir(site)):
    if top != "vllm" and not (top.startswith("vllm-") and top.endswith(".dist-info")):
        continue
    for root, dirs, files in os.walk(os.path.join(site, top)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, site)
            out["files"][rel] = hashlib.sha256(open(path, "rb").read()).hexdigest()
print(json.dumps(out))
"""


def local_tree_digest(version: str) -> dict[str, str]:
    tree = vllm_tree(version)
    files = {}
    for top in sorted(tree.iterdir()):
        if top.name != "vllm" and not top.name.endswith(".dist-info"):
            continue
        for path in top.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                files[path.relative_to(tree).as_posix()] = hashlib.sha256(
                    path.read_bytes()
                ).hexdigest()
    return files


def test_hosts_look_like_real_gpu_hosts(shared_sandbox: Sandbox) -> None:
    box = shared_sandbox
    assert box.state.user == "root"
    seen_netns = set()
    for host in box.hosts:
        # root logs in; the interpreter is /root/ml-env/bin/python, a venv of the system Python
        who = ssh(
            box,
            host.name,
            "id -u; echo $HOME; hostname; command -v nvidia-smi; readlink /proc/self/ns/net",
        )
        assert who.returncode == 0, who.stderr
        uid, home, hostname, smi, netns = who.stdout.split()
        assert (uid, home, hostname) == ("0", "/root", host.name)
        assert smi == "/usr/local/bin/nvidia-smi"
        seen_netns.add(netns)
        # the vLLM tree in site-packages is the wheel's, file for file and byte for byte
        res = ssh(box, host.name, f"{shlex.quote(host.python)} -c {shlex.quote(TREE_DIGEST)}")
        assert res.returncode == 0, res.stderr
        remote = json.loads(res.stdout)
        assert remote["site"].startswith("/root/ml-env/lib/python3.")
        assert remote["site"].endswith("/site-packages")
        assert remote["files"] == local_tree_digest(host.vllm)
        # Debian's supervisord runs, answering on its socket
        sup = ssh(
            box,
            host.name,
            "dpkg-query -W -f '${Status}' supervisor; echo; "
            'supervisorctl pid; ps -o args= -p "$(supervisorctl pid)"',
        )
        assert sup.returncode == 0, sup.stdout + sup.stderr
        status, pid, args = sup.stdout.splitlines()[:3]
        assert status == "install ok installed" and int(pid) > 1
        assert "/usr/bin/supervisord" in args
    # its own network namespace each (and not this machine's)
    assert len(seen_netns) == len(box.hosts)
    assert os.readlink("/proc/self/ns/net") not in seen_netns
    # port 22 published on 127.0.0.1 only, at the inventory's port
    for host in box.hosts:
        ports = engine("port", recorded_container(box, host.name), "22/tcp")
        assert ports.stdout.split() == [f"127.0.0.1:{host.port}"]


def test_down_removes_containers_and_network_and_status_names_the_ids(tmp_path: Path) -> None:
    box = Sandbox.up(
        tmp_path / "box", hosts=2, versions=["0.17.0"], load_seconds=1, no_supervisor=["sandbox-02"]
    )
    try:
        with_sup, without = (h.name for h in box.hosts)
        # the variant without supervisord: no package, no program; the host works otherwise
        res = ssh(
            box,
            without,
            "command -v supervisord supervisorctl; "
            "dpkg-query -W -f '${Status}' supervisor 2>/dev/null; echo rc=$?",
        )
        assert res.stdout.strip().endswith("rc=1"), res.stdout
        assert "supervisord" not in res.stdout.replace("rc=", "")
        assert ssh(box, with_sup, "supervisorctl pid").returncode == 0
        inspected = box.run_fleet("--json", "inspect", "--host", "all")
        assert inspected.returncode == 0, inspected.stderr
        assert all(h["ok"] for h in json.loads(inspected.stdout)["hosts"].values())

        # status: engine version and the ids of containers, images and network
        status = subprocess.run(
            [sys.executable, "-m", "fleet", "--json", "sandbox", "status", "--dir", str(box.dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        version = engine("version", "--format", "{{.Server.Version}}").stdout.strip()
        assert f"Docker Engine {version}" in doc["description"]
        base_id = engine(
            "image", "inspect", "--format", "{{.Id}}", docker.BASE_IMAGE
        ).stdout.strip()
        assert base_id.removeprefix("sha256:")[:12] in doc["description"]
        containers = {h.name: recorded_container(box, h.name) for h in box.hosts}
        network = (box.dir / "hosts" / "network").read_text().strip()
        for name, cid in containers.items():
            entry = doc["hosts"][name]
            assert entry["container"] == cid
            assert (
                entry["image_id"] == engine("inspect", "--format", "{{.Image}}", cid).stdout.strip()
            )
            assert entry["network"] == network
        assert doc["hosts"][without]["image"].endswith("-nosupervisor")
        assert doc["hosts"][without]["image_id"] != doc["hosts"][with_sup]["image_id"]
        attached = engine(
            "network",
            "inspect",
            "--format",
            "{{range $id, $c := .Containers}}{{$id}} {{end}}",
            network,
        )
        assert sorted(attached.stdout.split()) == sorted(containers.values())
    finally:
        stopped = box.down()
    assert sorted(stopped) == ["sandbox-01", "sandbox-02"]
    # nothing left: neither the containers (not even exited) nor the network
    for cid in containers.values():
        gone = engine("container", "inspect", cid)
        assert gone.returncode != 0 and "no such" in gone.stderr.lower(), gone.stdout
    listed = engine("ps", "-a", "-q", "--no-trunc").stdout.split()
    assert not set(containers.values()) & set(listed)
    assert engine("network", "inspect", network).returncode != 0
    assert not (box.dir / "hosts" / "network").exists()
    assert box.down() == []  # safe to run twice
    # the hosts come back after down (new containers on the same ports and keys)
    box.start_host(with_sup)
    try:
        assert ssh(box, with_sup, "true").returncode == 0
        assert recorded_container(box, with_sup) != containers[with_sup]
    finally:
        box.down(purge=True)
    assert not (box.dir / "hosts").exists()
    assert engine("network", "inspect", network).returncode != 0


def test_images_are_cached_and_rebuilt_when_an_input_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A variant no other test uses (0.16.0 without supervisor), so sandboxes are unaffected."""
    version, tag = "0.16.0", docker.image_tag("0.16.0", supervisor=False)
    tree = vllm_tree(version)
    monkeypatch.setattr(docker, "_READY", {})
    first = docker.ensure_image(version, tree, supervisor=False)
    docker._READY.clear()
    assert docker.ensure_image(version, tree, supervisor=False) == first  # cached: no build

    real_stage = docker.stage_serve_files

    def stage_more(overlay: Path, v: str) -> None:
        real_stage(overlay, v)
        (overlay / "root").mkdir(exist_ok=True)
        (overlay / "root" / "marker.txt").write_text("changed input\n")

    monkeypatch.setattr(docker, "stage_serve_files", stage_more)
    docker._READY.clear()
    changed = docker.ensure_image(version, tree, supervisor=False)
    assert changed != first
    shown = engine("run", "--rm", tag, "cat", "/root/marker.txt")
    assert shown.stdout == "changed input\n", shown.stderr
    label = engine(
        "image",
        "inspect",
        "--format",
        f'{{{{ index .Config.Labels "{docker.INPUTS_LABEL}" }}}}',
        tag,
    ).stdout.strip()
    assert len(label) == 64

    monkeypatch.setattr(docker, "stage_serve_files", real_stage)
    docker._READY.clear()
    back = docker.ensure_image(version, tree, supervisor=False)
    assert back != changed
    assert engine("run", "--rm", tag, "test", "-e", "/root/marker.txt").returncode == 1
    assert engine("image", "inspect", changed).returncode != 0  # the replaced image is gone


def test_serve_installs_fleets_own_supervisord_where_the_host_has_none(tmp_path: Path) -> None:
    """Two hosts, one from the image without Debian's supervisor package: ``fleet serve``
    runs Debian's supervisord where it is installed and, on the other, creates its own
    from the supervisor wheel it pushes (nothing downloaded on the host)."""
    from fleet.wheels import SUPERVISOR

    pushed = SUPERVISOR.partition("==")[2]
    box = Sandbox.up(
        tmp_path / "box", hosts=2, versions=["0.17.0"], load_seconds=2, no_supervisor=["sandbox-02"]
    )
    try:
        debian, bare = (h.name for h in box.hosts)
        assert ssh(box, bare, "command -v supervisord").returncode != 0
        patched = box.run_fleet("patch", "--host", "all", timeout=300)
        assert patched.returncode == 0, patched.stdout + patched.stderr
        proc = box.run_fleet("--json", "serve", "kimi-eagle3", "--host", "all", timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        served = json.loads(proc.stdout)["hosts"]
        assert {served[n]["outcome"] for n in (debian, bare)} == {"ready"}, served
        state = "cat ~/.fleet/run/kimi-eagle3/state.json"
        ps = 'ps -o args= -p "$(cat ~/.fleet/supervisor/supervisord.pid)"'
        # no supervisord on the host: fleet's own virtualenv with the wheel it pushed
        assert json.loads(ssh(box, bare, state).stdout)["supervisor_source"] == "fleet"
        own = ssh(
            box,
            bare,
            "~/.fleet/supervisor/venv/bin/python -c "
            "'import importlib.metadata as m; print(m.version(\"supervisor\"))'; " + ps,
        )
        assert own.returncode == 0, own.stderr
        version, args = own.stdout.splitlines()[:2]
        assert version == pushed
        assert "/root/.fleet/supervisor/venv/bin/python -m supervisor.supervisord" in args
        assert ssh(box, bare, "command -v supervisord").returncode != 0  # nothing installed
        # Debian's supervisord on the other, run with fleet's own configuration
        assert json.loads(ssh(box, debian, state).stdout)["supervisor_source"] == "host"
        theirs = ssh(box, debian, ps + "; test -e ~/.fleet/supervisor/venv || echo no-venv")
        assert theirs.returncode == 0, theirs.stderr
        assert theirs.stdout.splitlines()[0].endswith(
            "/usr/bin/supervisord -c /root/.fleet/supervisor/supervisord.conf"
        ), theirs.stdout
        assert theirs.stdout.splitlines()[1] == "no-venv"
        stopped = box.run_fleet("--json", "stop", "kimi-eagle3", "--host", "all", timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    finally:
        box.down(purge=True)


def test_serve_under_systemd_on_a_host_booted_with_it(tmp_path: Path) -> None:
    """A host whose PID 1 is systemd (the image's host-systemd target): ``supervisor:
    auto`` serves under a systemd unit; the follow survives a cut; status, stop and a
    crash read the unit; vLLM killed: the unit's cgroup is gone with it (no orphan);
    ``supervisor: supervisord`` on the same host still works (the seam, both ways)."""
    from tests.integration.serve_run import ServeRun, launches, on_phase, vllm_processes

    box = Sandbox.up(tmp_path / "box", hosts=1, versions=["0.17.0"], load_seconds=6,
                     systemd=["sandbox-01"])  # fmt: skip
    try:
        host = box.hosts[0].name
        assert ssh(box, host, "cat /proc/1/comm").stdout.strip() == "systemd"
        patched = box.run_fleet("patch", "--host", host, timeout=300)
        assert patched.returncode == 0, patched.stdout + patched.stderr
        box.set_sim(host, number_lines=True)
        run = ServeRun(box, host).when(on_phase("weights"), lambda _e: box.cut_sessions(host))
        code, r, err = run.start().finish()
        assert code == 0 and r["outcome"] == "ready" and r["supervisor"] == "systemd", (r, err)
        assert r["spec_decode"]["acceptance_rate"] is not None and r["link"]["reconnects"] >= 1
        assert launches(box, host) == 1
        unit = "fleet-kimi-eagle3.service"
        show = ssh(box, host, f"systemctl show {unit} -p ActiveState -p MainPID").stdout
        assert "ActiveState=active" in show and f"MainPID={r['pid']}" in show, show
        assert "fleet serve kimi-eagle3" in ssh(box, host, f"systemctl cat {unit}").stdout
        status = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
        entry = status["hosts"][host]["profiles"]["kimi-eagle3"]
        assert entry["state"] == "ready" and entry["pid"] == r["pid"], entry
        stopped = json.loads(box.run_fleet("--json", "stop", "kimi-eagle3", "--host", host).stdout)
        assert stopped["hosts"][host]["was_running"], stopped
        assert (
            "ActiveState=inactive" in ssh(box, host, f"systemctl show {unit} -p ActiveState").stdout
        )
        assert vllm_processes(box, host) == 0
        status = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
        assert status["hosts"][host]["profiles"]["kimi-eagle3"]["state"] == "stopped"

        # vLLM killed mid-load: crashed; the unit's whole cgroup ended with it
        box.set_sim(host, load_seconds=12)
        run = ServeRun(box, host).when(
            on_phase("weights"),
            lambda _e: ssh(box, host, f"kill -9 $(systemctl show -p MainPID --value {unit})"),
        )
        code, r, err = run.start().finish()
        assert code == 1 and r["outcome"] == "crashed", (r, err)
        assert r["diagnoses"][0]["id"] == "process-exited", r["diagnoses"]
        assert vllm_processes(box, host) == 0  # the workers too: systemd killed the cgroup
        status = json.loads(box.run_fleet("--json", "status", "--host", host).stdout)
        assert status["hosts"][host]["profiles"]["kimi-eagle3"]["state"] == "crashed"

        # the profile may still ask for supervisord on this host
        box.set_sim(host)
        box.set_host_var(host, "serve_supervisor", "supervisord")
        code, r, err = ServeRun(box, host).start().finish()
        assert code == 0 and r["outcome"] == "ready" and r["supervisor"] == "supervisord", r
        box.run_fleet("stop", "kimi-eagle3", "--host", host)
    finally:
        box.down(purge=True)

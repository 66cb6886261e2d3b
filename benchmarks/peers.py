"""fleet against Ansible, pyinfra and plain OpenSSH on the same sandbox hosts (Markdown).

    .venv/bin/python benchmarks/peers.py [--hosts 16 --hosts 128] [--scenario loopback
        --scenario wan] [--runs 5] [--work facts --work patch --work startup] [--json OUT]

Not part of the test run. Installs the peers (``ansible-core``, ``pyinfra``, by name with
pip) into a cache venv (``~/.cache/fleet/bench-peers/venv``), starts N real sshd hosts
(``fleet.sandbox``, every host on vLLM 0.17.0, the real wheel's source) and runs, for
every tool, the same work:

- ``facts``: what ``fleet inspect`` learns: vLLM's version and directory without importing
  it, the GPU list (nvidia-smi), EAGLE-3 support of DeepseekV2/V3ForCausalLM and
  KimiK25ForConditionalGeneration decided by parsing ``deepseek_v2.py``, ``kimi_k25.py``
  and ``config/speculative.py`` with ``ast`` in the host's Python, the sha256 of
  ``deepseek_v2.py`` and free disk. Peers: ``ansible-playbook`` (forks N, pipelining,
  ControlPersist; peer_work/facts.yml), a pyinfra deploy (``--parallel N``;
  peer_work/facts_deploy.py), plain OpenSSH with one ``ssh`` per step, and the OpenSSH
  floor: one ``ssh`` per host running every step in one remote shell script. A last
  reference, ``paramiko-floor`` (peer_work/paramiko_floor.py), runs that same script over
  paramiko after importing fleet's libraries and does nothing else: the least control
  CPU any client on fleet's stack can use, so fleet's own share is the difference;
- ``patch``: ``fleet patch --check``, then an apply, then a no-op apply, against the same
  edit (the unified diff fleet's engine makes for vLLM 0.17.0, the file a user keeps)
  applied with GNU patch by an Ansible playbook (``ansible.builtin.script``, ``--check``),
  a pyinfra deploy (``server.script``) and the OpenSSH and paramiko floors; every host is
  put back to the wheel's files before each tool's sequence, and every step's result is
  checked on the hosts' files (sha256 of each patched file);
- ``startup``: ``fleet --help`` against ``ansible --version`` and ``pyinfra --help``.

Scenarios: ``loopback`` (the sshd ports on 127.0.0.1) and ``wan``: every connection goes
through benchmarks/latency_proxy.py (20 ms each way, a TCP connect costs a round trip),
listening on 127.0.0.2 with the hosts' keys pinned for the proxy's address. Every tool
runs with N-way parallelism (``--forks N``, ``-f N``, ``--parallel N``, N ssh at once).

Each measurement is the median of ``--runs`` rounds after a warm-up round; the tools of a
round run one after the other in an order rotated every round (interleaved: a busy
period hits every tool alike). Wall time, and control-machine CPU: user+sys of the
tool's whole process tree (a cpuacct cgroup per run, so ssh ControlPersist masters and
forked workers count; the hosts' sshd and remote work do not), both also per host; and
host CPU per host: every process on the hosts during the run (the sshd listeners sit in
a cpuacct cgroup of their own, so each connection's sshd, shells, Pythons and tools are
counted), which on this machine shares the same cores as the tool.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.sandbox import model
from fleet.sandbox.core import Sandbox

HERE = Path(__file__).resolve().parent
PEER_WORK = HERE / "peer_work"
VERSION = "0.17.0"
PEER_PACKAGES = ("ansible-core", "pyinfra")
WAN_ADDRESS = "127.0.0.2"
WAN_DELAY_MS = 20.0
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")
HOST_SETTLE_S = 0.3
RUN_TIMEOUT = 1800.0
GPUS_PER_HOST = 8
EAGLE3_CLASSES = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "KimiK25ForConditionalGeneration",
)
DEEPSEEK = "model_executor/models/deepseek_v2.py"
FACT_TOOLS = ("fleet", "ansible", "pyinfra", "ssh-steps", "ssh-floor", "paramiko-floor")
PATCH_TOOLS = ("fleet", "ansible", "pyinfra", "ssh-floor", "paramiko-floor")
PATCH_STEPS = ("check", "apply", "no-op apply")
STARTUP = ("fleet --help", "ansible --version", "pyinfra --help")


def say(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


# -- the peers, in a cache venv ------------------------------------------------------------


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fleet" / "bench-peers"


def ensure_peers(cache: Path) -> Path:
    """The bin directory of a venv holding ansible-core and pyinfra (installed once)."""
    venv = cache / "venv"
    stamp = venv / ".fleet-bench-installed"
    want = " ".join(PEER_PACKAGES)
    ok = stamp.is_file() and stamp.read_text().strip() == want
    if ok and all((venv / "bin" / b).exists() for b in ("ansible-playbook", "pyinfra")):
        return venv / "bin"
    say(f"installing {want} into {venv} (pip, once)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *PEER_PACKAGES],
        check=True,
    )
    stamp.write_text(want + "\n")
    return venv / "bin"


def versions_of(bin_dir: Path) -> dict[str, str]:
    out = {}
    for name in ("ansible-core", "pyinfra", "paramiko"):
        proc = subprocess.run(
            [
                str(bin_dir / "python"),
                "-c",
                f"import importlib.metadata as m; print(m.version({name!r}))",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        out[name] = proc.stdout.strip() or "?"
    proc = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False)
    out["openssh"] = (proc.stderr or proc.stdout).strip().split(",")[0]
    return out


# -- one measured run: wall time and the CPU of the tool's process tree --------------------


@dataclass
class Run:
    wall: float
    user: float
    sys: float
    rc: int
    out: str
    err: str
    host_cpu: float = float("nan")  # CPU of every process on the hosts during the run

    @property
    def cpu(self) -> float:
        return self.user + self.sys


class Meter:
    """Runs a command and measures its wall time and its process tree's CPU.

    With a writable cpuacct cgroup (v1) each run gets a cgroup of its own: every process
    the tool starts is in it, daemonized ones too (ssh ControlPersist masters), and what
    is left when the tool exits is stopped (they are this run's own processes). Without
    one, the CPU of waited-for descendants (getrusage) is used and noted."""

    def __init__(self) -> None:
        self.cgroups = self._cgroups_work()
        self.serial = 0
        self.hosts_group: Path | None = None

    def watch_hosts(self, pids: Sequence[int]) -> None:
        """The hosts' sshd listeners in a cgroup of their own: every process a connection
        makes on a host (sshd's children, the shells, Pythons and tools they start) is
        counted as the hosts' CPU of the run that made it (``Run.host_cpu``)."""
        if not self.cgroups:
            return
        group = CGROUP_ROOT / f"fleet-bench-{os.getpid()}-hosts"
        group.mkdir(exist_ok=True)
        for pid in pids:
            with contextlib.suppress(OSError), open(group / "cgroup.procs", "w") as fh:
                fh.write(str(pid))
        self.hosts_group = group

    def release_hosts(self) -> None:
        group, self.hosts_group = self.hosts_group, None
        if group is None:
            return
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError), open(CGROUP_ROOT / "cgroup.procs", "w") as fh:
                fh.write(pid)
        with contextlib.suppress(OSError):
            group.rmdir()

    def _hosts_usage(self) -> float:
        if self.hosts_group is None:
            return float("nan")
        return int((self.hosts_group / "cpuacct.usage").read_text()) / 1e9

    @staticmethod
    def _cgroups_work() -> bool:
        probe = CGROUP_ROOT / f"fleet-bench-{os.getpid()}-probe"
        try:
            probe.mkdir()
        except OSError:
            return False
        ok = (probe / "cpuacct.usage_user").exists()
        with contextlib.suppress(OSError):
            probe.rmdir()
        return ok

    @property
    def method(self) -> str:
        if self.cgroups:
            return "cpuacct cgroup per run (the whole process tree, daemons included)"
        return "getrusage of waited-for children (daemonized processes not counted)"

    def run(self, argv: Sequence[str], env: dict[str, str], cwd: Path | None = None) -> Run:
        self.serial += 1
        group = CGROUP_ROOT / f"fleet-bench-{os.getpid()}-{self.serial}" if self.cgroups else None
        preexec: Callable[[], None] | None = None
        if group is not None:
            group.mkdir()
            procs = str(group / "cgroup.procs")

            def preexec() -> None:
                with open(procs, "w") as fh:
                    fh.write(str(os.getpid()))

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        hosts_before = self._hosts_usage()
        started = time.perf_counter()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            preexec_fn=preexec,
        )
        try:
            out, err = proc.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        wall = time.perf_counter() - started
        if self.hosts_group is not None:
            time.sleep(HOST_SETTLE_S)  # what the hosts still do for the connections it closed
        hosts_after = self._hosts_usage()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if group is not None:
            user = int((group / "cpuacct.usage_user").read_text()) / 1e9
            system = int((group / "cpuacct.usage_sys").read_text()) / 1e9
            self._empty(group)
        else:
            user = after.ru_utime - before.ru_utime
            system = after.ru_stime - before.ru_stime
        return Run(
            wall,
            user,
            system,
            proc.returncode,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
            hosts_after - hosts_before,
        )

    @staticmethod
    def _empty(group: Path) -> None:
        """Stop what the run left in its cgroup (its own processes), then remove it."""
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and (group / "cgroup.procs").read_text().strip():
                time.sleep(0.02)
        with contextlib.suppress(OSError):
            group.rmdir()


# -- the hosts as each tool sees them -------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    address: str
    port: int
    python: str
    pkg: str
    home: str


@dataclass
class Scenario:
    name: str
    dir: Path
    targets: list[Target]
    known_hosts: Path
    fleet_inventory: Path
    ansible_inventory: Path
    pyinfra_inventory: Path
    ssh_hosts: Path
    proxy_pid: int | None = None


def package_dir(host: model.SandboxHost) -> str:
    env = str(Path(host.home) / model.ENV_DIR)
    return os.path.realpath(os.path.join(model.site_packages(env, sys.version_info[:2]), "vllm"))


def build_scenario(box: Sandbox, name: str, root: Path) -> Scenario:
    """Inventories and known_hosts of every tool for ``name`` (loopback or wan)."""
    sdir = root / name
    sdir.mkdir(parents=True, exist_ok=True)
    impl = box.backend()
    address = WAN_ADDRESS if name == "wan" else None
    targets = [
        Target(
            h.name,
            address or h.address,
            h.port,
            h.python,
            package_dir(h),
            h.home,
        )
        for h in box.hosts
    ]
    kh = sdir / "known_hosts"
    kh.write_text(
        "".join(
            model.known_hosts_line(t.address, t.port, impl.public_key(h)) + "\n"
            for t, h in zip(targets, box.hosts, strict=True)
        )
    )
    hosts = [
        h.model_copy(update={"address": t.address}) for t, h in zip(targets, box.hosts, strict=True)
    ]
    state = box.state.model_copy(update={"hosts": hosts})
    fleet_inv = sdir / "inventory.yaml"
    fleet_inv.write_text(
        model.render_inventory(state, ssh_key=str(box.client_key_path), known_hosts=str(kh))
    )
    key = str(box.client_key_path)
    user = box.state.user
    ansible_hosts = {
        t.name: {
            "ansible_host": t.address,
            "ansible_port": t.port,
            "ansible_python_interpreter": t.python,
            "vllm_dir": t.pkg,
        }
        for t in targets
    }
    ansible_inv = sdir / "ansible-inventory.json"
    ansible_inv.write_text(
        json.dumps(
            {
                "all": {
                    "vars": {
                        "ansible_user": user,
                        "ansible_ssh_private_key_file": key,
                        "ansible_connection": "ssh",
                    },
                    "hosts": ansible_hosts,
                }
            },
            indent=1,
        )
    )
    pyinfra_inv = sdir / "pyinfra_inventory.py"
    entries = [
        (
            t.name,
            {
                "ssh_hostname": t.address,
                "ssh_port": t.port,
                "ssh_user": user,
                "ssh_key": key,
                "ssh_known_hosts_file": str(kh),
                "ssh_strict_host_key_checking": "yes",
                "ssh_allow_agent": False,
                "ssh_look_for_keys": False,
                "python": t.python,
                "vllm_dir": t.pkg,
            },
        )
        for t in targets
    ]
    pyinfra_inv.write_text(
        f"# pyinfra inventory of the peers benchmark (generated)\nsandbox = {entries!r}\n"
    )
    ssh_hosts = sdir / "ssh-hosts.txt"
    ssh_hosts.write_text(
        "".join(f"{t.name} {t.address} {t.port} {t.python} {t.pkg}\n" for t in targets)
    )
    return Scenario(name, sdir, targets, kh, fleet_inv, ansible_inv, pyinfra_inv, ssh_hosts)


@contextlib.contextmanager
def latency_proxy(sc: Scenario, box: Sandbox) -> Iterator[None]:
    """benchmarks/latency_proxy.py in front of every host (127.0.0.2:port -> 127.0.0.1:port)."""
    mapping = [[WAN_ADDRESS, h.port, h.address, h.port] for h in box.hosts]
    map_file = sc.dir / "proxy-map.json"
    map_file.write_text(json.dumps(mapping))
    ready = sc.dir / "proxy.ready"
    ready.unlink(missing_ok=True)
    log = open(sc.dir / "proxy.log", "wb")  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "latency_proxy.py"),
            "--map",
            str(map_file),
            "--delay-ms",
            str(WAN_DELAY_MS),
            "--ready",
            str(ready),
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"latency proxy did not start (see {sc.dir / 'proxy.log'})")
            time.sleep(0.05)
        sc.proxy_pid = proc.pid
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        sc.proxy_pid = None


# -- the work files (the peers' playbooks, deploys and scripts) -----------------------------


@dataclass
class PatchWork:
    diff: str
    files: dict[str, tuple[str, str]]  # path -> (sha256 before, sha256 after)
    originals: dict[str, bytes]


def patch_work() -> PatchWork:
    """The edit every tool makes: fleet's engine run on vLLM 0.17.0's real files."""
    from fleet.patching.engine import plan_host
    from fleet.patching.manifest import load_patch_set
    from fleet.sandbox.vllm_source import vllm_file

    ps = load_patch_set()
    texts: dict[str, str | None] = {}
    originals: dict[str, bytes] = {}
    for f in ps.manifest.files:
        path = vllm_file(VERSION, f.path)
        if path.exists():
            originals[f.path] = path.read_bytes()
            texts[f.path] = originals[f.path].decode("utf-8")
        else:
            texts[f.path] = None
    plan = plan_host(ps, VERSION, texts)
    if not plan.ok:
        raise RuntimeError(f"the patch set does not apply to vLLM {VERSION}")
    diff = "".join(f.diff() for f in plan.files if f.changes)
    files = {f.path: (str(f.sha256_before), str(f.sha256_after)) for f in plan.files if f.changes}
    return PatchWork(diff, files, {p: originals[p] for p in files})


def write_work(gen: Path, pw: PatchWork) -> None:
    """peer_work/ plus the generated scripts (the diff and the Python parts pasted in)."""
    shutil.copytree(PEER_WORK, gen, dirs_exist_ok=True)
    locate = (PEER_WORK / "vllm_locate.py").read_text()
    check = (PEER_WORK / "eagle3_check.py").read_text()
    floor = (PEER_WORK / "facts_floor.sh.in").read_text()
    floor = floor.replace("@VLLM_LOCATE@\n", locate).replace("@EAGLE3_CHECK@\n", check)
    (gen / "facts_floor.sh").write_text(floor)
    script = (PEER_WORK / "patch.sh.in").read_text()
    script = script.replace("@DIFF@", pw.diff).replace(
        "@FILES@", " ".join(f"'{p}'" for p in pw.files)
    )
    (gen / "patch.sh").write_text(script)


# -- the tools ---------------------------------------------------------------------------------


@dataclass
class Tools:
    fleet: list[str]
    peers: Path  # bin dir of the peers' venv
    gen: Path
    forks: int
    tmp: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("FLEET_INVENTORY", None)
        # a user's shell: Python writes its byte-code caches (some CI shells turn that off,
        # which would make every tool compile its sources on every run)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PATH"] = f"{self.peers}{os.pathsep}{env.get('PATH', '')}"
        env["COLUMNS"] = "200"
        env["NO_COLOR"] = "1"
        env.update(extra)
        return env

    def ansible_env(self, sc: Scenario, out: Path) -> dict[str, str]:
        # (ControlPath sockets need a short directory: 108 bytes of sun_path)
        cp = out / "cp"
        cp.mkdir(exist_ok=True)
        return self.env(
            ANSIBLE_HOME=str(self.tmp / "ansible-home"),
            ANSIBLE_LOCAL_TEMP=str(out / "ansible-local"),
            ANSIBLE_PIPELINING="True",
            ANSIBLE_FORKS=str(self.forks),
            ANSIBLE_HOST_KEY_CHECKING="True",
            ANSIBLE_SSH_ARGS=(
                "-C -o ControlMaster=auto -o ControlPersist=60s -o IdentitiesOnly=yes "
                f"-o UserKnownHostsFile={sc.known_hosts} -o StrictHostKeyChecking=yes"
            ),
            ANSIBLE_CONTROL_PATH_DIR=str(cp),
            ANSIBLE_STDOUT_CALLBACK="oneline",
            ANSIBLE_RETRY_FILES_ENABLED="False",
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_DEPRECATION_WARNINGS="False",
            ANSIBLE_SYSTEM_WARNINGS="False",
        )

    def ssh_env(self, sc: Scenario, box: Sandbox) -> dict[str, str]:
        return self.env(
            FB_USER=box.state.user,
            FB_KEY=str(box.client_key_path),
            FB_KNOWN_HOSTS=str(sc.known_hosts),
            FB_WORK=str(self.gen),
        )

    def facts(
        self, tool: str, sc: Scenario, box: Sandbox, out: Path
    ) -> tuple[list[str], dict[str, str]]:
        n = str(self.forks)
        if tool == "fleet":
            argv = [*self.fleet, "--inventory", str(sc.fleet_inventory), "--forks", n]
            return [*argv, "inspect", "--host", "all", "--json"], self.env()
        if tool == "ansible":
            pb = str(self.peers / "ansible-playbook")
            argv = [pb, "-i", str(sc.ansible_inventory), "-f", n, str(self.gen / "facts.yml")]
            return argv, self.ansible_env(sc, out)
        if tool == "pyinfra":
            argv = [str(self.peers / "pyinfra"), "-y", "--parallel", n]
            argv += [str(sc.pyinfra_inventory), str(self.gen / "facts_deploy.py")]
            return argv, self.env(FLEET_BENCH_WORK=str(self.gen), FLEET_BENCH_OUT=str(out))
        run = str(self.gen / "ssh_run.sh")
        if tool == "ssh-steps":
            return ["sh", run, "steps", str(sc.ssh_hosts), str(out)], self.ssh_env(sc, box)
        if tool == "ssh-floor":
            argv = ["sh", run, "floor", str(sc.ssh_hosts), str(out)]
            return [*argv, str(self.gen / "facts_floor.sh")], self.ssh_env(sc, box)
        if tool == "paramiko-floor":
            argv = [*self.paramiko_floor(sc, out), str(self.gen / "facts_floor.sh")]
            return argv, self.ssh_env(sc, box)
        raise ValueError(tool)

    def paramiko_floor(self, sc: Scenario, out: Path) -> list[str]:
        """The floor of fleet's own stack (peer_work/paramiko_floor.py), in fleet's venv."""
        script = str(PEER_WORK / "paramiko_floor.py")
        return [sys.executable, script, str(sc.ssh_hosts), str(out)]

    def patch(
        self, tool: str, step: str, sc: Scenario, box: Sandbox, out: Path
    ) -> tuple[list[str], dict[str, str]]:
        n = str(self.forks)
        check = step == "check"
        if tool == "fleet":
            argv = [*self.fleet, "--inventory", str(sc.fleet_inventory), "--forks", n]
            argv += ["patch", "--host", "all", "--json"]
            return [*argv, "--check"] if check else argv, self.env()
        if tool == "ansible":
            pb = str(self.peers / "ansible-playbook")
            argv = [pb, "-i", str(sc.ansible_inventory), "-f", n, str(self.gen / "patch.yml")]
            return [*argv, "--check"] if check else argv, self.ansible_env(sc, out)
        if tool == "pyinfra":
            argv = [str(self.peers / "pyinfra"), "-y", "--parallel", n]
            if check:
                argv += ["--data", "mode=check"]
            argv += [str(sc.pyinfra_inventory), str(self.gen / "patch_deploy.py")]
            return argv, self.env(FLEET_BENCH_WORK=str(self.gen))
        if tool == "ssh-floor":
            argv = ["sh", str(self.gen / "ssh_run.sh"), "floor", str(sc.ssh_hosts), str(out)]
            argv += [str(self.gen / "patch.sh"), "check" if check else "apply"]
            return argv, self.ssh_env(sc, box)
        if tool == "paramiko-floor":
            argv = [*self.paramiko_floor(sc, out), str(self.gen / "patch.sh")]
            return [*argv, "check" if check else "apply"], self.ssh_env(sc, box)
        raise ValueError(tool)


# -- checking that each tool did the work ---------------------------------------------------


def sha256_file(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def expected_facts(sc: Scenario) -> dict[str, dict[str, Any]]:
    return {
        t.name: {
            "version": VERSION,
            "eagle3": dict.fromkeys(EAGLE3_CLASSES, False),
            "sha256": sha256_file(os.path.join(t.pkg, DEEPSEEK)),
            "gpus": GPUS_PER_HOST,
        }
        for t in sc.targets
    }


def facts_seen(tool: str, run: Run, out: Path, sc: Scenario) -> dict[str, dict[str, Any]]:
    """Per host, what the tool reported: version, eagle3, sha256, GPU count."""
    seen: dict[str, dict[str, Any]] = {}
    if tool == "fleet":
        doc = json.loads(run.out)
        for name, h in doc["hosts"].items():
            if not h.get("ok"):
                continue
            vllm = h.get("vllm") or {}
            files = vllm.get("files") or {}
            seen[name] = {
                "version": vllm.get("version"),
                "eagle3": vllm.get("eagle3"),
                "sha256": (files.get(DEEPSEEK) or {}).get("sha256"),
                "gpus": len(h.get("gpus") or []),
            }
    elif tool == "ansible":
        for line in run.out.splitlines():
            if "fleet_bench_facts" not in line or " | SUCCESS => " not in line:
                continue
            name, _, doc = line.partition(" | SUCCESS => ")
            facts = json.loads(doc)["msg"]["fleet_bench_facts"]
            seen[name.strip()] = {
                "version": facts["version"],
                "eagle3": facts["eagle3"],
                "sha256": facts["sha256"],
                "gpus": len(facts["gpus"]),
            }
    elif tool == "pyinfra":
        for t in sc.targets:
            path = out / f"{t.name}.json"
            if path.exists():
                facts = json.loads(path.read_text())
                seen[t.name] = {
                    "version": facts["version"],
                    "eagle3": facts["eagle3"],
                    "sha256": facts["sha256"],
                    "gpus": len(facts["gpus"]),
                }
    else:
        for t in sc.targets:
            rc = out / f"{t.name}.rc"
            if not rc.exists() or rc.read_text().strip() != "0":
                continue
            lines = (out / t.name).read_text().splitlines()
            loc = json.loads(next(x for x in lines if x.startswith('{"version"')))
            e3 = json.loads(next(x for x in lines if x.startswith('{"eagle3"')))
            sha = next(x.split()[0] for x in lines if x.endswith(DEEPSEEK))
            gpus = [x for x in lines if x[:1].isdigit() and "NVIDIA" in x]
            seen[t.name] = {
                "version": loc["version"],
                "eagle3": e3["eagle3"],
                "sha256": sha,
                "gpus": len(gpus),
            }
    return seen


def check_facts(tool: str, run: Run, out: Path, sc: Scenario, *, full: bool) -> str | None:
    """None when every host's facts were reported (and, with ``full``, are right)."""
    if run.rc != 0:
        return f"exit {run.rc}: {(run.err or run.out).strip()[-400:]}"
    try:
        seen = facts_seen(tool, run, out, sc)
    except (ValueError, KeyError, StopIteration, TypeError) as exc:
        return f"output not understood: {type(exc).__name__}: {exc}"
    missing = [t.name for t in sc.targets if t.name not in seen]
    if missing:
        return f"no facts for {len(missing)} host(s), e.g. {missing[0]}"
    if full:
        want = expected_facts(sc)
        for name, facts in seen.items():
            if facts != want[name]:
                return f"{name}: reported {facts}, expected {want[name]}"
    return None


def reset_hosts(sc: Scenario, pw: PatchWork) -> None:
    """Every host back to the wheel's files (and no fleet backups): a fresh start."""
    for t in sc.targets:
        for rel, data in pw.originals.items():
            path = Path(t.pkg) / rel
            tmp = path.with_name(path.name + ".bench-reset")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        shutil.rmtree(Path(t.home) / ".fleet" / "patches", ignore_errors=True)


def check_patch(step: str, run: Run, sc: Scenario, pw: PatchWork) -> str | None:
    """The files on every host are what the step must leave (sha256 per file)."""
    if run.rc != 0:
        return f"exit {run.rc}: {(run.err or run.out).strip()[-400:]}"
    index = 0 if step == "check" else 1
    for t in sc.targets:
        for rel, shas in pw.files.items():
            got = sha256_file(os.path.join(t.pkg, rel))
            if got != shas[index]:
                state = "patched" if index else "unchanged"
                return f"{t.name}: {rel} is not {state} after {step}"
    return None


# -- rounds -------------------------------------------------------------------------------------


@dataclass
class Series:
    runs: list[Run] = field(default_factory=list)
    failure: str | None = None

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs) if self.runs else float("nan")


def rotated(items: Sequence[str], k: int) -> list[str]:
    k %= len(items)
    return [*items[k:], *items[:k]]


def fresh_out(root: Path, label: str) -> Path:
    out = root / label
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


def bench_facts(
    meter: Meter, tools: Tools, sc: Scenario, box: Sandbox, runs: int, only: Sequence[str]
) -> dict[str, Series]:
    results = {t: Series() for t in only}
    for rnd in range(runs + 1):
        warm = rnd == 0
        for tool in rotated(only, rnd):
            series = results[tool]
            if series.failure:
                continue
            out = fresh_out(sc.dir / "out", f"facts-{tool}")
            argv, env = tools.facts(tool, sc, box, out)
            run = meter.run(argv, env)
            problem = check_facts(tool, run, out, sc, full=warm)
            if problem:
                series.failure = problem
                say(f"{sc.name} facts {tool}: FAILED: {problem}")
                continue
            if not warm:
                series.runs.append(run)
            say(
                f"{sc.name} facts {tool} {'warm-up' if warm else f'run {rnd}'}: "
                f"{run.wall:.2f} s wall, {run.cpu:.2f} s CPU"
            )
    return results


def bench_patch(
    meter: Meter,
    tools: Tools,
    sc: Scenario,
    box: Sandbox,
    runs: int,
    pw: PatchWork,
    only: Sequence[str],
) -> dict[str, dict[str, Series]]:
    results = {t: {s: Series() for s in PATCH_STEPS} for t in only}
    for rnd in range(runs + 1):
        warm = rnd == 0
        for tool in rotated(only, rnd):
            steps = results[tool]
            if any(s.failure for s in steps.values()):
                continue
            reset_hosts(sc, pw)
            for step in PATCH_STEPS:
                out = fresh_out(sc.dir / "out", f"patch-{tool}")
                argv, env = tools.patch(tool, step, sc, box, out)
                run = meter.run(argv, env)
                problem = check_patch(step, run, sc, pw)
                if problem:
                    steps[step].failure = problem
                    say(f"{sc.name} patch {tool} {step}: FAILED: {problem}")
                    break
                if not warm:
                    steps[step].runs.append(run)
                say(
                    f"{sc.name} patch {tool} {step} {'warm-up' if warm else f'run {rnd}'}: "
                    f"{run.wall:.2f} s wall, {run.cpu:.2f} s CPU"
                )
    reset_hosts(sc, pw)
    return results


def bench_startup(meter: Meter, tools: Tools, runs: int) -> dict[str, Series]:
    argvs = {
        "fleet --help": [*tools.fleet, "--help"],
        "ansible --version": [str(tools.peers / "ansible"), "--version"],
        "pyinfra --help": [str(tools.peers / "pyinfra"), "--help"],
    }
    env = tools.env(ANSIBLE_HOME=str(tools.tmp / "ansible-home"))
    results = {k: Series() for k in argvs}
    for rnd in range(runs + 1):
        for name in rotated(list(argvs), rnd):
            run = meter.run(argvs[name], env)
            if run.rc != 0:
                results[name].failure = f"exit {run.rc}: {run.err.strip()[-300:]}"
            elif rnd:
                results[name].runs.append(run)
    return results


# -- tables -------------------------------------------------------------------------------------


def fmt_s(value: float) -> str:
    if value != value:  # nan
        return "-"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def ratio(a: float, b: float) -> str:
    if a != a or b != b or b <= 0:
        return "-"
    return f"{a / b:.1f}x"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def table_rows(
    label: str, series: dict[str, Series], hosts: int, targets: list[str]
) -> tuple[list[str], list[str]]:
    fleet = series.get("fleet")
    rows = []
    notes = []
    fw = fleet.median("wall") if fleet else float("nan")
    fc = fleet.median("cpu") if fleet else float("nan")
    for tool, s in series.items():
        if s.failure:
            rows.append(f"| {label} | {tool} | FAILED: {s.failure[:120]} | | | | | |")
            continue
        wall, cpu, host_cpu = s.median("wall"), s.median("cpu"), s.median("host_cpu")
        rows.append(
            f"| {label} | {tool} | {fmt_s(wall)} | {fmt_s(wall / hosts)} | {fmt_s(cpu)} | "
            f"{fmt_s(cpu / hosts)} | {fmt_s(host_cpu / hosts)} | "
            f"{ratio(wall, fw) if tool != 'fleet' else '1x'} |"
        )
    if fleet and not fleet.failure:
        for tool, s in series.items():
            if tool == "fleet" or s.failure or not s.runs:
                continue
            wall, cpu = s.median("wall"), s.median("cpu")
            if tool == "ssh-floor":
                verdict = _verdict(fw <= wall)
                notes.append(
                    f"{label}: fleet wall <= OpenSSH floor: {verdict} "
                    f"({fmt_s(fw)} vs {fmt_s(wall)})"
                )
            elif tool == "ansible":
                verdict = _verdict(wall >= 8 * fw)
                notes.append(
                    f"{label}: >= 8x faster than ansible-playbook: {verdict} ({ratio(wall, fw)})"
                )
            elif tool == "pyinfra":
                verdict = _verdict(wall >= 2 * fw)
                notes.append(f"{label}: >= 2x faster than pyinfra: {verdict} ({ratio(wall, fw)})")
                ok = fc <= cpu / 2
                notes.append(
                    f"{label}: CPU/host <= half of pyinfra's: {'PASS' if ok else 'MISS'} "
                    f"({fmt_s(fc / hosts)} vs {fmt_s(cpu / hosts)})"
                )
                floor = series.get("paramiko-floor")
                if floor and not floor.failure and floor.runs:
                    reach = floor.median("cpu") <= cpu / 2
                    notes.append(
                        f"{label}: half of pyinfra's CPU/host is within reach of fleet's "
                        f"stack (the paramiko floor's CPU/host is at most that): "
                        f"{'yes' if reach else 'no'} ({fmt_s(floor.median('cpu') / hosts)} "
                        f"vs {fmt_s(cpu / 2 / hosts)})"
                    )
            elif tool == "paramiko-floor":
                notes.append(
                    f"{label}: fleet's control CPU/host against the floor of its stack: "
                    f"{fmt_s(fc / hosts)} vs {fmt_s(cpu / hosts)} (fleet's own: "
                    f"{fmt_s((fc - cpu) / hosts)} per host)"
                )
    targets.extend(notes)
    return rows, notes


HEADER = (
    "| work | tool | wall (median) | wall / host | control CPU (median) | CPU / host "
    "| host CPU / host | wall vs fleet |\n|---|---|---|---|---|---|---|---|"
)


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"Peers: {', '.join(f'{k} {v}' for k, v in doc['versions'].items())}; "
        f"fleet {doc['fleet_version']}; Python {doc['python']}; {doc['cpus']} CPUs; "
        f"CPU measured by {doc['cpu_method']}; medians of {doc['runs']} interleaved runs "
        "after a warm-up.",
        "",
    ]
    for block in doc["blocks"]:
        lines.append(
            f"### {block['hosts']} hosts, {block['scenario']} "
            f"(load average before {block['load_before']}, after {block['load_after']})"
        )
        lines.append("")
        lines.append(HEADER)
        lines.extend(block["rows"])
        lines.append("")
        for note in block["targets"]:
            lines.append(f"- {note}")
        lines.append("")
    if doc.get("startup"):
        s = doc["startup"]
        lines.append(f"### CLI start-up (load average {s['load']})")
        lines.append("")
        lines.append(
            "| command | wall (median) | CPU (median) | vs fleet --help |\n|---|---|---|---|"
        )
        fw = s["wall"].get("fleet --help", float("nan"))
        for name in STARTUP:
            if name in s["failure"]:
                lines.append(f"| `{name}` | FAILED: {s['failure'][name][:100]} | | |")
                continue
            wall, cpu = s["wall"][name], s["cpu"][name]
            lines.append(f"| `{name}` | {fmt_s(wall)} | {fmt_s(cpu)} | {ratio(wall, fw)} |")
        aw = s["wall"].get("ansible --version", float("nan"))
        ok = aw >= 5 * fw
        lines.append("")
        lines.append(
            f"- `fleet --help` >= 5x faster than `ansible --version`: "
            f"{'PASS' if ok else 'MISS'} ({ratio(aw, fw)})"
        )
        lines.append("")
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------


def sshd_pids(box: Sandbox) -> list[int]:
    """The listening sshd of each local sandbox host (``hosts/<name>/sshd.pid``)."""
    pids = []
    for host in box.hosts:
        with contextlib.suppress(OSError, ValueError):
            pids.append(int((Path(host.home).parent / "sshd.pid").read_text().split()[0]))
    return pids


def fleet_argv() -> list[str]:
    exe = Path(sys.executable).parent / "fleet"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "fleet"]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, action="append", default=None)
    parser.add_argument("--scenario", choices=("loopback", "wan"), action="append", default=None)
    parser.add_argument(
        "--work", choices=("facts", "patch", "startup"), action="append", default=None
    )
    parser.add_argument("--tool", action="append", default=None, help="only these tools")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--startup-runs", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--keep", type=Path, default=None, help="work directory (kept)")
    args = parser.parse_args()
    sizes = args.hosts or [16, 128]
    scenarios = args.scenario or ["loopback", "wan"]
    work = args.work or ["facts", "patch", "startup"]
    if args.runs < 1 or any(n < 1 for n in sizes):
        parser.error("--runs and --hosts must be at least 1")
    cache = cache_dir()
    peers = ensure_peers(cache)
    meter = Meter()
    import fleet

    doc: dict[str, Any] = {
        "versions": versions_of(peers),
        "fleet_version": fleet.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "cpu_method": meter.method,
        "runs": args.runs,
        "blocks": [],
    }
    pw = patch_work()
    with contextlib.ExitStack() as stack:
        if args.keep:
            root = args.keep.absolute()
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-peers-")))
        gen = root / "work"
        write_work(gen, pw)
        if "startup" in work:
            tools = Tools(fleet_argv(), peers, gen, 1, root)
            say(f"start-up, {args.startup_runs} runs each")
            la = load()
            res = bench_startup(meter, tools, args.startup_runs)
            doc["startup"] = {
                "load": la,
                "wall": {k: s.median("wall") for k, s in res.items()},
                "cpu": {k: s.median("cpu") for k, s in res.items()},
                "failure": {k: s.failure for k, s in res.items() if s.failure},
            }
        for size in sizes if {"facts", "patch"} & set(work) else []:
            tools = Tools(fleet_argv(), peers, gen, size, root)
            say(f"sandbox up: {size} hosts (vLLM {VERSION})")
            started = time.perf_counter()
            box = Sandbox.up(
                root / f"sandbox-{size}", hosts=size, versions=[VERSION], load_seconds=1
            )
            say(f"sandbox up took {time.perf_counter() - started:.1f} s")
            meter.watch_hosts(sshd_pids(box))
            try:
                for name in scenarios:
                    sc = build_scenario(box, name, root / f"scenario-{size}")
                    with latency_proxy(sc, box) if name == "wan" else contextlib.nullcontext():
                        block: dict[str, Any] = {
                            "hosts": size,
                            "scenario": name
                            if name == "loopback"
                            else f"WAN ({WAN_DELAY_MS:.0f} ms each way)",
                            "load_before": load(),
                            "rows": [],
                            "targets": [],
                            "raw": {},
                        }
                        if "facts" in work:
                            only = [t for t in FACT_TOOLS if not args.tool or t in args.tool]
                            res = bench_facts(meter, tools, sc, box, args.runs, only)
                            rows, _ = table_rows("facts (inspect)", res, size, block["targets"])
                            block["rows"] += rows
                            block["raw"]["facts"] = {
                                t: [[r.wall, r.cpu, r.host_cpu] for r in s.runs]
                                for t, s in res.items()
                            }
                        if "patch" in work:
                            only = [t for t in PATCH_TOOLS if not args.tool or t in args.tool]
                            pres = bench_patch(meter, tools, sc, box, args.runs, pw, only)
                            for step in PATCH_STEPS:
                                per = {t: pres[t][step] for t in only}
                                rows, _ = table_rows(f"patch: {step}", per, size, block["targets"])
                                block["rows"] += rows
                                block["raw"][f"patch {step}"] = {
                                    t: [[r.wall, r.cpu, r.host_cpu] for r in s.runs]
                                    for t, s in per.items()
                                }
                        block["load_after"] = load()
                        doc["blocks"].append(block)
                        print(render({**doc, "blocks": [block], "startup": None}), flush=True)
            finally:
                meter.release_hosts()
                box.down(purge=True)
    text = render(doc)
    print("\n## Results\n")
    print(text)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

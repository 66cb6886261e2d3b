"""Run the rehearsal vLLM (fleet/onhost/rehearsal/vllm_sim.py) for real, against real vLLM trees.

A "home" is what a sandbox host has: ``.fleet-sandbox/host.json`` (load_seconds),
optional ``sim.json`` knobs, ``models/`` (fleet.sandbox.checkpoints) and the ``vllm``
executable (fleet.onhost.client.executable with this interpreter). The vLLM tree is found
the way the simulator finds it on a host (import machinery, here via PYTHONPATH): the
real wheel's files, or a copy patched with fleet's patch engine (as
tests/unit/test_patch_behaviour.py patches).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.onhost.client import executable
from fleet.patching.engine import plan_host
from fleet.patching.manifest import load_patch_set
from fleet.sandbox.checkpoints import build_models
from fleet.sandbox.local import free_port
from fleet.sandbox.vllm_source import vllm_tree

DRAFTER = "Kimi-K25-eagle3"


def vtuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3])


def target_for(version: str) -> str:
    """Kimi-K2.5 from vLLM 0.15 (KimiK25ForConditionalGeneration), Kimi-K2 before."""
    return "Kimi-K2.5" if vtuple(version) >= (0, 15) else "Kimi-K2-Instruct"


def patched_tree(version: str, root: Path, only: Sequence[str] | None = None) -> Path:
    """A copy of the real ``version`` tree with fleet's EAGLE-3 patch set applied (only
    the files ``only`` names, when given), cached under ``root``."""
    tag = "all" if only is None else "-".join(sorted(p.replace("/", "_") for p in only))
    dest = root / f"{version}-{tag}"
    if (dest / ".done").exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(vllm_tree(version), dest)
    patch_set = load_patch_set()
    texts: dict[str, str | None] = {}
    for spec in patch_set.manifest.files:
        path = dest / "vllm" / spec.path
        texts[spec.path] = path.read_text(encoding="utf-8") if path.exists() else None
    plan = plan_host(patch_set, version, texts)
    assert plan.ok, [c.describe() for c in plan.conflicts]
    for item in plan.files:
        if item.new_text is None or item.new_text == item.original:
            continue
        if only is not None and item.path not in only:
            continue
        (dest / "vllm" / item.path).write_text(item.new_text, encoding="utf-8")
    (dest / ".done").write_text("")
    return dest


def make_home(
    path: Path,
    *,
    load_seconds: float = 1.0,
    knobs: dict[str, Any] | None = None,
    python: str | None = None,
    gpu_state: dict[str, Any] | None = None,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    state = path / ".fleet-sandbox"
    (state / "run").mkdir(parents=True, exist_ok=True)
    (state / "host.json").write_text(json.dumps({"load_seconds": load_seconds, "gpu_count": 8}))
    if knobs is not None:
        (state / "sim.json").write_text(json.dumps(knobs))
    if gpu_state is not None:
        (state / "gpu-state.json").write_text(json.dumps(gpu_state))
    if not (path / "models").exists():
        build_models(path)
    exe = path / "vllm"
    exe.write_text(executable("rehearsal.vllm_sim", "main", python or sys.executable))
    exe.chmod(0o755)
    return path


def serve_args(
    home: Path,
    version: str,
    *,
    target: str | None = None,
    drafter: str | None = DRAFTER,
    port: int | None = None,
    extra: Sequence[str] = (),
    spec: dict[str, Any] | None = None,
) -> list[str]:
    models = home / "models"
    args = [
        str(home / "vllm"),
        "serve",
        str(models / (target or target_for(version))),
        "--tensor-parallel-size",
        "8",
        "--trust-remote-code",
        "--served-model-name",
        "kimi-k2.5",
        "--port",
        str(port or free_port("127.0.0.1")),
    ]
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec)]
    elif drafter:
        args += [
            "--speculative-config",
            json.dumps(
                {"method": "eagle3", "model": str(models / drafter), "num_speculative_tokens": 3}
            ),
        ]
    return args + list(extra)


@dataclass
class SimRun:
    returncode: int | None
    ready: bool
    log: bytes
    stdout: bytes
    stderr: bytes
    seconds: float
    port: int

    @property
    def text(self) -> str:
        return self.log.decode("utf-8", errors="replace")

    def physical_lines(self) -> list[str]:
        """The log split on ``\\n`` only (a ``\\r`` stays inside its line)."""
        lines = self.text.split("\n")
        return lines[:-1] if lines and lines[-1] == "" else lines

    def diagnose_lines(self) -> list[str]:
        return self.text.replace("\r\n", "\n").split("\n")


def port_of(args: Sequence[str]) -> int:
    return int(args[list(args).index("--port") + 1])


class Sim:
    """One running simulator (``start``), or a run to its end (``run``)."""

    def __init__(
        self,
        home: Path,
        tree: Path,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        split_streams: bool = False,
    ) -> None:
        self.home = home
        self.args = list(args)
        self.port = port_of(args)
        self.log_path = home / "serve.log"
        self.out_path = home / "serve.stdout"
        self.err_path = home / "serve.stderr"
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "PYTHONPATH": str(tree),
            "LANG": "C.UTF-8",
        }
        environment.update(env or {})
        if split_streams:
            out = open(self.out_path, "wb")  # noqa: SIM115
            err = open(self.err_path, "wb")  # noqa: SIM115
        else:
            out = open(self.log_path, "wb")  # noqa: SIM115
            err = None
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err if err is not None else subprocess.STDOUT,
            env=environment,
            cwd=home,
            start_new_session=True,
        )
        out.close()
        if err is not None:
            err.close()
        self.split = split_streams

    def output(self) -> bytes:
        if self.split:
            return self.out_path.read_bytes() + self.err_path.read_bytes()
        return self.log_path.read_bytes() if self.log_path.exists() else b""

    def wait_for(self, needle: bytes, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.output():
                return True
            if self.proc.poll() is not None:
                return needle in self.output()
            time.sleep(0.05)
        return False

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the simulator's process group (its EngineCore and workers too)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def result(self, ready: bool) -> SimRun:
        stdout = self.out_path.read_bytes() if self.split else b""
        stderr = self.err_path.read_bytes() if self.split else b""
        return SimRun(
            self.proc.returncode,
            ready,
            self.output(),
            stdout,
            stderr,
            time.monotonic() - self.started,
            self.port,
        )


def run_sim(
    home: Path,
    tree: Path,
    args: Sequence[str],
    *,
    stop_when_ready: bool = True,
    timeout: float = 90.0,
    env: dict[str, str] | None = None,
    split_streams: bool = False,
) -> SimRun:
    """Run until the simulator exits; a server that becomes ready is sent SIGTERM (the
    way an operator stops it) unless ``stop_when_ready`` is false."""
    sim = Sim(home, tree, args, env=env, split_streams=split_streams)
    try:
        ready = sim.wait_for(b"Application startup complete.", timeout)
        if ready and stop_when_ready:
            sim.signal(signal.SIGTERM)
        sim.wait(timeout=timeout)
    finally:
        if sim.proc.poll() is None:
            sim.kill()
    return sim.result(ready)


_PREFIX = re.compile(
    r"^(?P<colour>\x1b\[[0-9;]*m)?\((?P<name>[A-Za-z_][\w]*) pid=(?P<pid>\d+)\)"
    r"(?P<reset>\x1b\[[0-9;]*m)? "
)
_HEADER = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<date>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[(?P<file>[^\]:]+):(?P<line>\d+)\] (?P<msg>.*)$",
    re.S,
)


@dataclass(frozen=True)
class Shape:
    """A physical line taken apart: prefixes (name, pid), the record header, the rest."""

    prefixes: tuple[tuple[str, int], ...]
    colours: tuple[str, ...]
    level: str | None
    file: str | None
    line: int | None
    message: str

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _p in self.prefixes)


def shape_of(physical: str) -> Shape:
    text = physical
    prefixes: list[tuple[str, int]] = []
    colours: list[str] = []
    while True:
        match = _PREFIX.match(text)
        if not match:
            break
        prefixes.append((match.group("name"), int(match.group("pid"))))
        colours.append(match.group("colour") or "")
        text = text[match.end() :]
    header = _HEADER.match(text)
    if header:
        return Shape(
            tuple(prefixes),
            tuple(colours),
            header.group("level"),
            header.group("file"),
            int(header.group("line")),
            header.group("msg"),
        )
    return Shape(tuple(prefixes), tuple(colours), None, None, None, text)


def lines_matching(lines: Iterable[str], needle: str) -> list[str]:
    return [line for line in lines if needle in line]

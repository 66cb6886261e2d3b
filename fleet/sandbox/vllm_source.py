"""The real vLLM source of a given version: the wheel downloaded by name with pip, cached.

Only the Python files and the ``.dist-info`` metadata are unpacked (no compiled kernels):
enough for ``importlib.metadata``/``find_spec`` to find vLLM without importing it, for the
patch engine to edit the real files and for the facts script to parse them.

Cache layout (``fleet.paths.cache_dir()``, ``$FLEET_CACHE`` overrides)::

    wheels/vllm-<version>-*.whl        only while unpacking (removed afterwards)
    vllm/<version>/vllm/...            the package
    vllm/<version>/vllm-<version>.dist-info/
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleet.errors import OperationFailed
from fleet.paths import cache_dir


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _find_wheel(wheels: Path, version: str) -> Path | None:
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    return found[0] if found else None


def wheel_path(version: str) -> Path:
    """The cached vLLM wheel of ``version``, downloaded by package name with pip if missing."""
    wheels = cache_dir() / "wheels"
    with _locked(cache_dir() / "locks" / f"wheel-{version}.lock"):
        found = _find_wheel(wheels, version)
        if found:
            return found
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-cache-dir",
            "--only-binary=:all:",
            "--dest",
            str(wheels),
            f"vllm=={version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = _find_wheel(wheels, version)
        if proc.returncode != 0 or not found:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise OperationFailed(f"could not download the vLLM {version} wheel with pip: {last}")
        return found


def vllm_tree(version: str) -> Path:
    """A directory holding ``vllm/`` (Python files only) and its ``.dist-info``.

    Unpacked once per version and cached; safe to call from parallel processes.
    """
    root = cache_dir() / "vllm" / version
    if (root / ".complete").exists():
        return root
    wheel = wheel_path(version)
    with _locked(cache_dir() / "locks" / f"tree-{version}.lock"):
        if (root / ".complete").exists():
            return root
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=root.parent))
        try:
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    top = name.split("/", 1)[0]
                    keep = (top == "vllm" and name.endswith(".py")) or (
                        top.endswith(".dist-info") and not name.endswith("/")
                    )
                    if keep:
                        zf.extract(name, tmp)
            (tmp / ".complete").write_text(wheel.name + "\n")
            if root.exists():
                shutil.rmtree(root)
            os.replace(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # The unpacked tree (~25 MB) is the cache; the wheel (~430 MB) is not needed again.
        wheel.unlink(missing_ok=True)
    return root


def vllm_file(version: str, relpath: str) -> Path:
    """One file of the vLLM package, e.g. ``model_executor/models/deepseek_v2.py``."""
    return vllm_tree(version) / "vllm" / relpath

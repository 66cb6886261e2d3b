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

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from fleet.localfiles import locked
from fleet.paths import cache_dir
from fleet.wheels import wheel


def wheel_path(version: str) -> Path:
    """The cached vLLM wheel of ``version``, downloaded by package name with pip if missing."""
    return wheel(f"vllm=={version}")


def vllm_tree(version: str) -> Path:
    """A directory holding ``vllm/`` (Python files only) and its ``.dist-info``.

    Unpacked once per version and cached; safe to call from parallel processes.
    """
    root = cache_dir() / "vllm" / version
    if (root / ".complete").exists():
        return root
    archive = wheel_path(version)
    with locked(cache_dir() / "locks" / f"tree-{version}.lock"):
        if (root / ".complete").exists():
            return root
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=root.parent))
        try:
            with zipfile.ZipFile(archive) as zf:
                for name in zf.namelist():
                    top = name.split("/", 1)[0]
                    keep = (top == "vllm" and name.endswith(".py")) or (
                        top.endswith(".dist-info") and not name.endswith("/")
                    )
                    if keep:
                        zf.extract(name, tmp)
            (tmp / ".complete").write_text(archive.name + "\n")
            if root.exists():
                shutil.rmtree(root)
            os.replace(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # The unpacked tree (~25 MB) is the cache; the wheel (~430 MB) is not needed again.
        archive.unlink(missing_ok=True)
    return root


def vllm_file(version: str, relpath: str) -> Path:
    """One file of the vLLM package, e.g. ``model_executor/models/deepseek_v2.py``."""
    return vllm_tree(version) / "vllm" / relpath

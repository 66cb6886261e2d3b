"""A sandbox host that runs the real vLLM CPU engine: its ``ml-env``.

``<home>/ml-env`` is a virtual environment of the interpreter fleet runs on, holding:

- its own ``vllm`` package: a copy of the version environment's whose files are hard links
  (cheap: no data is copied). ``fleet patch`` replaces a file by writing a new one and
  renaming it over the old, which only ever changes this host's link, so patching one
  host never touches the cached environment or another host;
- a ``.pth`` line adding the version environment's site-packages and the shared torch
  environment's (everything else vLLM needs, shared by every host of that version);
- the TEST-ONLY plugin package ``vllm_sandbox_testonly`` with the entry point vLLM loads
  (``vllm.general_plugins``), and ``bin/vllm``: the launcher (``in_env/vllm_launcher.py``)
  run by this environment's python, with the CPU settings, the plugin switched on and the
  libraries vLLM 0.18+ wants preloaded.
"""

from __future__ import annotations

import os
import shutil
import venv
from pathlib import Path

from fleet.errors import OperationFailed
from fleet.localfiles import atomic_write
from fleet.onhost.families import version_tuple
from fleet.sandbox.real_engine import envs

IN_ENV = Path(__file__).resolve().parent / "in_env"
PLUGIN = "vllm_sandbox_testonly"
PLUGIN_VERSION = "0.1.0"
PTH = "fleet-sandbox-vllm-cpu.pth"
TCMALLOC_GLOBS = ("/usr/lib/*/libtcmalloc_minimal.so.4", "/usr/lib/*/libtcmalloc.so.4")
PLUGIN_METADATA = f"""Metadata-Version: 2.1
Name: vllm-sandbox-testonly
Version: {PLUGIN_VERSION}
Summary: TEST-ONLY vLLM plugin of fleet's sandbox hosts (EAGLE-3 on the CPU runner)
"""
ENTRY_POINTS = f"[vllm.general_plugins]\nsandbox_testonly = {PLUGIN}:register\n"


def tcmalloc() -> str | None:
    """The system's tcmalloc (vLLM 0.18+ CPU refuses to start without it preloaded)."""
    import glob

    for pattern in TCMALLOC_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def install_host(env: Path, version: str) -> Path:
    """Make ``env`` (a host's ``ml-env``) a vLLM ``version`` environment; returns its python."""
    cached = envs.version_env(version)
    if version_tuple(version) >= (0, 18) and tcmalloc() is None:
        raise OperationFailed(
            f"vLLM {version}'s CPU engine needs tcmalloc (Debian: apt-get install "
            "libtcmalloc-minimal4; scripts/test-real.sh installs it)"
        )
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(env)
    python = env / "bin" / "python"
    site = envs.site_packages(env)
    site.mkdir(parents=True, exist_ok=True)
    _link_tree(envs.package_dir(cached), site / "vllm")
    base = envs.torch_env()
    atomic_write(
        site / PTH,
        f"{envs.site_packages(cached)}\n{envs.site_packages(base)}\n",
        mode=0o644,
    )
    plugin = site / PLUGIN
    shutil.copytree(IN_ENV / PLUGIN, plugin, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    info = site / f"{PLUGIN}-{PLUGIN_VERSION}.dist-info"
    atomic_write(info / "METADATA", PLUGIN_METADATA, mode=0o644)
    atomic_write(info / "entry_points.txt", ENTRY_POINTS, mode=0o644)
    atomic_write(info / "top_level.txt", PLUGIN + "\n", mode=0o644)
    atomic_write(env / "bin" / "vllm", launcher(python, cached), mode=0o755)
    return python


def launcher(python: Path, cached: Path) -> str:
    """``bin/vllm``: the launcher module, run by the host's python, told where the
    version's environment is (its libiomp5.so) and that the plugin is wanted."""
    source = (IN_ENV / "vllm_launcher.py").read_text(encoding="utf-8")
    header = (
        f"#!{python}\n"
        "# fleet sandbox (TEST ONLY): the `vllm` of a host running vLLM's CPU build; see\n"
        "# fleet/sandbox/real_engine/in_env/vllm_launcher.py\n"
        f"VERSION_ENV = {str(cached)!r}\n"
    )
    return header + source


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` mirrors ``src`` with every file a hard link (``__pycache__`` left out)."""
    if dst.exists():
        shutil.rmtree(dst)
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        here = dst / os.path.relpath(dirpath, src)
        here.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            os.link(os.path.join(dirpath, name), here / name)

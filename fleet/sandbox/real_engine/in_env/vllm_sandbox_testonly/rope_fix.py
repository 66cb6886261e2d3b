"""TEST-ONLY: work around vLLM's CPU rotary-embedding kernel bug for 3-D inputs.

``RotaryEmbedding.forward_cpu`` (vllm/model_executor/layers/rotary_embedding/base.py,
line 277 in 0.17.0/0.18.0, 256 in 0.15.1) calls the in-place C++ kernel
``ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)``. For a
query shaped ``[tokens, heads, rot_dim]`` with more than one head the kernel rotates the
wrong elements; the same data as a 2-D ``[tokens, heads * rot_dim]`` tensor is rotated
right. ``DeepseekV2Attention.forward`` (the non-MLA path, the only one vLLM < 0.24 CPU
allows, via ``VLLM_MLA_DISABLE=1``) passes the 3-D ``q_pe`` view.

The replacement flattens every >2-D argument into a contiguous 2-D copy, calls the stock
method, and writes the result back into the caller's tensor (which may be a strided view).
``forward_cpu`` is only reached when the ``rotary_embedding`` custom op is enabled, i.e.
with ``--enforce-eager`` (custom_ops "all"); under torch.compile (custom_ops "none") vLLM
uses ``forward_native``, which is correct. CustomOp binds its forward method when the
layer is constructed, so this must be installed before the model is built (vLLM loads
general plugins before that in every process).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("vllm.sandbox_testonly")
_MARK = "_sandbox_testonly_rope_fix"


def install() -> bool:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    if getattr(RotaryEmbedding, _MARK, False):
        return True
    stock_forward_cpu = RotaryEmbedding.forward_cpu

    def forward_cpu(self: Any, positions: Any, query: Any, key: Any = None) -> Any:
        if query.dim() <= 2 and (key is None or key.dim() <= 2):
            return stock_forward_cpu(self, positions, query, key)
        q2 = query.reshape(query.shape[0], -1).clone()
        k2 = None if key is None else key.reshape(key.shape[0], -1).clone()
        stock_forward_cpu(self, positions, q2, k2)  # rotates q2/k2 in place
        query.copy_(q2.view(query.shape))
        if key is not None and k2 is not None:
            key.copy_(k2.view(key.shape))
        return query, key

    RotaryEmbedding.forward_cpu = forward_cpu
    setattr(RotaryEmbedding, _MARK, True)
    log.warning("[sandbox-testonly] CPU rotary-embedding 2-D workaround installed (TEST ONLY)")
    return True

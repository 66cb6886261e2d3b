"""TEST-ONLY: let vLLM's CPU model runner (0.15.1 / 0.17.0 / 0.18.0) run the GPU runner's
EAGLE-3 speculative-decoding path.

What the stock code does (vllm/v1/worker/, same in the three versions unless noted):

* ``cpu_model_runner.py`` ``CPUModelRunner.__init__``: ``super().__init__`` inside
  ``_torch_cuda_wrapper()`` (``torch.Event`` / ``torch.cuda.Stream`` become placeholders),
  then ``assert self.speculative_config is None, "spec decode is not supported."``
  (line 25 in 0.17.0/0.18.0, 24 in 0.15.1), then CPU post-processing of the buffers.
  ``GPUModelRunner.__init__`` has by then already built the ``EagleProposer`` (drafter)
  and set ``use_aux_hidden_state_outputs`` for ``method == "eagle3"``.
* ``CPUModelRunner.load_model``: ``get_model`` (+ LoRA) only. ``GPUModelRunner.load_model``
  additionally runs ``self.drafter.load_model(self.model)`` and, for EAGLE-3, checks
  ``supports_eagle3(self.get_model())`` (raising ``RuntimeError("Model does not support
  EAGLE3 interface but aux_hidden_state_outputs was requested")``), takes the aux layers
  from ``_get_eagle3_aux_layers_from_config()`` or the model's default
  (``get_eagle3_aux_hidden_state_layers()`` in 0.15/0.17,
  ``get_eagle3_default_aux_hidden_state_layers()`` in 0.18) and calls
  ``set_aux_hidden_state_layers``.
* ``GPUModelRunner._copy_draft_token_ids_to_cpu`` / ``_copy_valid_sampled_token_count``
  use ``torch.cuda.current_stream()`` / ``torch.cuda.stream(...)``, which fail without an
  NVIDIA driver. On CPU a plain synchronous copy is equivalent (the events are the
  placeholders made by ``_torch_cuda_wrapper``; CPU forces ``async_scheduling=False``).

The shim installs only when the installed ``CPUModelRunner.__init__`` still contains the
assert (so it is a no-op on vLLM versions whose CPU runner supports spec decode itself),
and refuses loudly if the body is not the one it knows.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

log = logging.getLogger("vllm.sandbox_testonly")

_ASSERT = 'assert self.speculative_config is None, "spec decode is not supported."'
# The statements of the stock CPUModelRunner.__init__ the replacement reproduces, in order.
_EXPECTED_INIT = (
    "with _torch_cuda_wrapper():",
    "super().__init__(vllm_config, device)",
    'assert device == torch.device("cpu")',
    _ASSERT,
    "self.use_cuda_graph = False",
    "self.cascade_attn_enabled = False",
    "self._postprocess_tensors()",
)
_MARK = "_sandbox_testonly_spec_shim"


def install() -> bool:
    """Install the shim on ``CPUModelRunner``; return whether it is (now) installed."""
    import torch
    from vllm.v1.worker import cpu_model_runner as cmr
    from vllm.v1.worker import gpu_model_runner as gmr

    runner = cmr.CPUModelRunner
    if getattr(runner, _MARK, False):
        return True
    src = inspect.getsource(runner.__init__)
    if _ASSERT not in src:
        log.warning("[sandbox-testonly] CPUModelRunner has no spec-decode assert: shim not needed")
        return False
    lines = [ln.strip() for ln in src.splitlines()[1:] if ln.strip()]
    if tuple(lines) != _EXPECTED_INIT:
        raise RuntimeError(
            "[sandbox-testonly] unknown CPUModelRunner.__init__ in this vLLM; "
            f"refusing to shim it:\n{src}"
        )
    stock_load_model = runner.load_model
    has_default_layers = hasattr(
        __import__(
            "vllm.model_executor.models.interfaces", fromlist=["SupportsEagle3"]
        ).SupportsEagle3,
        "get_eagle3_default_aux_hidden_state_layers",
    )

    def __init__(self: Any, vllm_config: Any, device: Any) -> None:
        with cmr._torch_cuda_wrapper():
            gmr.GPUModelRunner.__init__(self, vllm_config, device)
        assert device == torch.device("cpu")
        self.use_cuda_graph = False
        self.cascade_attn_enabled = False
        self._postprocess_tensors()

    def load_model(self: Any, *args: Any, **kwargs: Any) -> None:
        # Stock CPU body (get_model + LoRA); args: eep_scale_up (0.15) / load_dummy_weights.
        stock_load_model(self, *args, **kwargs)
        # What GPUModelRunner.load_model of this version does next (EPLB parts omitted:
        # EPLB is not available on CPU).
        if hasattr(self, "drafter"):
            gmr.logger.info_once("Loading drafter model...")
            self.drafter.load_model(self.model)
        if self.use_aux_hidden_state_outputs:
            if not gmr.supports_eagle3(self.get_model()):
                raise RuntimeError(
                    "Model does not support EAGLE3 interface but "
                    "aux_hidden_state_outputs was requested"
                )
            aux_layers = self._get_eagle3_aux_layers_from_config()
            if aux_layers:
                gmr.logger.info("Using auxiliary layers from speculative config: %s", aux_layers)
            elif has_default_layers:  # 0.18
                aux_layers = self.model.get_eagle3_default_aux_hidden_state_layers()
            else:  # 0.15 / 0.17
                aux_layers = self.model.get_eagle3_aux_hidden_state_layers()
            self.model.set_aux_hidden_state_layers(aux_layers)

    def _copy_draft_token_ids_to_cpu(
        self: Any, scheduler_output: Any, zeros_only: bool = False
    ) -> None:
        # GPUModelRunner's body without the CUDA stream: a synchronous copy.
        if self.use_async_scheduling and not (
            scheduler_output.has_structured_output_requests
            or self.input_batch.sampling_metadata.output_token_ids
        ):
            return
        self._draft_token_req_ids = self.input_batch.req_ids.copy()
        draft_token_ids = self._draft_token_ids
        if not torch.is_tensor(draft_token_ids):
            return
        assert self.draft_token_ids_cpu is not None
        num_reqs = draft_token_ids.shape[0]
        if zeros_only:
            self.draft_token_ids_cpu[:num_reqs] = 0
        else:
            self.draft_token_ids_cpu[:num_reqs].copy_(draft_token_ids)

    def _copy_valid_sampled_token_count(
        self: Any, next_token_ids: Any, valid_sampled_tokens_count: Any
    ) -> None:
        if self.valid_sampled_token_count_event is None:
            return
        counts_cpu = self.valid_sampled_token_count_cpu
        assert counts_cpu is not None
        counts_cpu[: valid_sampled_tokens_count.shape[0]].copy_(valid_sampled_tokens_count)
        self.input_batch.prev_sampled_token_ids = next_token_ids.unsqueeze(1)

    runner.__init__ = __init__
    runner.load_model = load_model
    runner._copy_draft_token_ids_to_cpu = _copy_draft_token_ids_to_cpu
    runner._copy_valid_sampled_token_count = _copy_valid_sampled_token_count
    setattr(runner, _MARK, True)
    log.warning(
        "[sandbox-testonly] CPU spec-decode shim installed on %s (TEST ONLY)",
        runner.__qualname__,
    )
    return True

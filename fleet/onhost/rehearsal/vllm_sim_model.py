# fleet on-host module: a model or drafter directory as the rehearsal vLLM reads it.
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# What vLLM reads of a checkpoint before it loads a byte of weights: `config.json` (the
# text config of a multimodal model, the architectures, the model type), the index's
# total size, and the safetensors headers (which tensors a drafter carries of its own).
import json
import os
from typing import Any, Dict, List, Optional, Tuple

SIM_HEADER_MAX = 100 * 1024**2  # a safetensors header larger than this is not read


def sim_read_json(path: str) -> Dict[str, Any]:
    """A JSON object from `path`, or {} (missing, unreadable, not an object)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _safetensors_header(path: str) -> Dict[str, Any]:
    """The JSON header of a .safetensors file (8-byte little-endian length + JSON)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return {}
            size = int.from_bytes(raw, "little")
            if size <= 0 or size > SIM_HEADER_MAX:
                return {}
            doc = json.loads(fh.read(size).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


class SimModel:
    """A model or drafter directory as vLLM reads it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.exists = os.path.isdir(path)
        self.config = sim_read_json(os.path.join(path, "config.json"))
        text = self.config.get("text_config")
        self.text = text if isinstance(text, dict) else self.config
        archs = self.config.get("architectures") or []
        self.arch = str(archs[0]) if archs else ""
        self.archs = [str(a) for a in archs]
        self.model_type = str(self.config.get("model_type") or "")
        self.text_model_type = str(self.text.get("model_type") or self.model_type)
        self.shards = sorted(
            f for f in (os.listdir(path) if self.exists else []) if f.endswith(".safetensors")
        )
        index = sim_read_json(os.path.join(path, "model.safetensors.index.json"))
        self.total_size = 0
        try:
            self.total_size = int((index.get("metadata") or {}).get("total_size") or 0)
        except (TypeError, ValueError):
            self.total_size = 0
        self.tensors: Dict[str, Any] = {}
        if len(self.shards) <= 4:
            for shard in self.shards:
                header = _safetensors_header(os.path.join(path, shard))
                self.tensors.update({k: v for k, v in header.items() if k != "__metadata__"})
        if not self.total_size and self.tensors:
            self.total_size = sum(
                int((v.get("data_offsets") or [0, 0])[1])
                - int((v.get("data_offsets") or [0, 0])[0])
                for v in self.tensors.values()
                if isinstance(v, dict)
            )

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.text:
            return self.text[key]
        return self.config.get(key, default)

    @property
    def layers(self) -> int:
        return int(self.get("num_hidden_layers", 0) or 0)

    @property
    def max_len(self) -> int:
        return int(self.get("max_position_embeddings", 0) or 0) or 2048

    def has_tensor(self, suffix: str) -> bool:
        return any(name.endswith(suffix) for name in self.tensors)

    def aux_layer_ids(self, version: Tuple[int, ...]) -> Optional[List[int]]:
        """The drafter's aux layer ids as this vLLM reads them: top level only before
        0.25, `eagle_config.eagle_aux_hidden_state_layer_ids` too from 0.25
        (gpu_model_runner._get_eagle3_aux_layers_from_config)."""
        ids = self.config.get("eagle_aux_hidden_state_layer_ids")
        if ids is None and version >= (0, 25):
            nested = self.config.get("eagle_config")
            if isinstance(nested, dict):
                ids = nested.get("eagle_aux_hidden_state_layer_ids")
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            return [int(i) for i in ids]
        return None

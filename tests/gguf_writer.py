"""Write a transformers model as a GGUF file the way llama.cpp's convert_hf_to_gguf.py does, and
give back the weights the file really holds (after quantization) for a reference model."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import torch

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
# ggml's K-quants: block bytes, and where each block's fp16 scales sit (gguf-py cannot quantize
# them, so blocks are random bytes with sane scales)
K_QUANTS = {"Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                 "{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def gguf_name(hf: str) -> str:
    stem, _, suffix = hf.rpartition(".")
    if stem in TOP:
        return f"{TOP[stem]}.{suffix}"
    _, _, i, rest = stem.split(".", 3)               # model.layers.I.rest
    return f"blk.{i}.{LAYER[rest]}.{suffix}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: halves-rotation rows to interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2,
                     *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(w: np.ndarray, qtype: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(bytes or values to write, the float32 values a reader gets back)."""
    kind = gguf.GGMLQuantizationType[qtype]
    if qtype == "F32":
        return w, w
    if qtype == "F16":
        return w.astype(np.float16), w.astype(np.float16).astype(np.float32)
    if qtype in K_QUANTS:
        size, scale_at = K_QUANTS[qtype]
        raw = rng.integers(0, 256, (w.shape[0], w.shape[1] // 256, size), dtype=np.uint8)
        for at in scale_at:
            scale = rng.uniform(2e-5, 1e-4, raw.shape[:2]).astype(np.float16)
            raw[:, :, at:at + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
        raw = raw.reshape(w.shape[0], -1)
    else:
        raw = gguf.quants.quantize(w, kind)
    return raw, gguf.quants.dequantize(raw, kind)


def llama3_factors(config, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's rope_freqs for llama3 scaling: one divisor per frequency."""
    p = config.rope_parameters
    freqs = 1.0 / (p["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old = p["original_max_position_embeddings"]
    low, high = old / p["low_freq_factor"], old / p["high_freq_factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high:
            factors.append(1.0)
        elif wavelen > low:
            factors.append(p["factor"])
        else:
            smooth = ((old / wavelen - p["low_freq_factor"])
                      / (p["high_freq_factor"] - p["low_freq_factor"]))
            factors.append(1 / ((1 - smooth) / p["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def add_tokenizer(w: gguf.GGUFWriter, vocab: int, letters: str = "etaoinshrd") -> None:
    """A tiny gpt2-style BPE vocabulary: 3 control tokens, the 256 byte symbols, then merges of
    pairs of `letters` (other letters: another vocabulary of the same size)."""
    # GPT-2's byte-to-symbol table: printable bytes stand for themselves, the rest from 256 up
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    symbols = [chr(b) for b in printable] + [chr(256 + i) for i in range(len(others))]
    merges = [f"{a} {b}" for a in letters for b in letters][:vocab - 3 - len(symbols)]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *symbols,
              *(m.replace(" ", "") for m in merges)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    w.add_eot_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)


def write_gguf(hf, path: Path, qtype: str | dict[str, str] = "F32", *,
               tokenizer: bool | str = False, seed: int = 0) -> dict[str, torch.Tensor]:
    """Write `hf` to `path`: norms in F32, matrices in `qtype`, or in `qtype[role]` by their GGUF
    role ("token_embd", "ffn_down", ...; "default" for the rest), as llama.cpp's mixes (Q4_K_M)
    write them; with a tokenizer when `tokenizer` (a string: the letters of its merges).
    Returns the state dict a reference model must load to compute what the file holds."""
    c = hf.config
    arch = ARCH[c.model_type]
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {c.model_type}")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(head_dim)
    if head_dim != c.hidden_size // heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    rope = c.rope_parameters
    w.add_rope_freq_base(rope["rope_theta"])
    if rope["rope_type"] in ("linear", "yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType(rope["rope_type"]))
        w.add_rope_scaling_factor(rope["factor"])
    if rope["rope_type"] == "yarn":
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if rope["rope_type"] == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(c, head_dim))
    if tokenizer:
        add_tokenizer(w, c.vocab_size, *([tokenizer] if isinstance(tokenizer, str) else []))

    rng = np.random.default_rng(seed)
    held = {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        role = gguf_name(name).split(".")[-2]
        kind = "F32" if t.ndim != 2 else (qtype if isinstance(qtype, str)
                                          else qtype.get(role, qtype["default"]))
        raw, held_values = encode(t.detach().float().numpy(), kind, rng)
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            # rows only move, and each row is quantized on its own: permuting the encoded rows
            # is what the converter's permute-then-quantize writes
            raw = permute(raw, heads if ".q_proj." in name else kv_heads)
        raw_dtype = gguf.GGMLQuantizationType[kind] if raw.dtype == np.uint8 else None
        w.add_tensor(gguf_name(name), raw, raw_dtype=raw_dtype)
        held[name] = torch.from_numpy(np.ascontiguousarray(held_values))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def reference(hf, held: dict[str, torch.Tensor]):
    """A copy of `hf` with the weights the GGUF file holds."""
    import copy

    ref = copy.deepcopy(hf)
    ref.load_state_dict(held, strict=False)
    return ref.eval()

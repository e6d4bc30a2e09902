"""The network from checkpoint tensors: layer weights under Hugging Face names (without
'model.'), fused into q|k|v and gate|up products, each product dense or kept quantized.

A weight is either a dense tensor or GGUF `Blocks` (quant.py). Blocks of a format the int4
kernels read stay quantized when `keep_quantized` (Q6_K only where longspec::int4_mm runs);
dense weights are quantized when `quantize` ('q4' or 'q8') asks for it. Everything else is cast
to the dtype.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import groupby

import torch
from torch import nn

from .compiled import int4_mm
from .config import ModelConfig
from .linear import DenseLinear, Int4Linear, RowParts
from .quant import (
    KERNEL_TYPES,
    SIXTEEN_TYPES,
    Blocks,
    concat_rows,
    k_factors,
    kernel_operands,
    q6_factors,
    quantize_dense,
    sixteen_operands,
)
from .transformer import Transformer

KERNEL_ROWS = 16      # the int4 kernel's output features come in multiples of this
KERNEL_GROUP = 32
DENSE_CHUNKS = 8      # dense(): a matrix dequantized in this many parts of its rows


def dense(w, dtype: torch.dtype, device) -> torch.Tensor:
    """A weight as a dense tensor (GGUF blocks dequantized by the gguf package: a large matrix in
    chunks of rows on two threads, each converted to `dtype` as it comes, the same values as
    at once; an embedding of 151,936 rows in 0.5x the time, without its float32 copy)."""
    if isinstance(w, Blocks):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        qtype = GGMLQuantizationType[w.qtype]
        rows = w.shape[0]
        out = torch.empty(w.shape, dtype=dtype)
        step = -(-rows // DENSE_CHUNKS)

        def part(first: int) -> None:
            values = dequantize(w.raw[first:first + step], qtype)
            out[first:first + step] = torch.from_numpy(values).reshape(-1, w.shape[1])

        with ThreadPoolExecutor(max_workers=2) as pool:   # numpy lets go of the GIL
            list(pool.map(part, range(0, rows, step)))
        w = out
    return w.to(device=device, dtype=dtype)


def _fits_kernel(shape: tuple[int, int], device) -> bool:
    out, k = shape
    return device.type == "cpu" and out % KERNEL_ROWS == 0 and k % KERNEL_GROUP == 0


def _kept_quantized(w, device) -> bool:
    """Whether these are GGUF blocks the int4 kernels take as they are (Q6_K only where
    longspec::int4_mm runs)."""
    return (isinstance(w, Blocks) and _fits_kernel(w.shape, device)
            and (w.qtype in KERNEL_TYPES or (w.qtype in SIXTEEN_TYPES and int4_mm())))


def make_linear(w, bias, dtype: torch.dtype, device, quantize: str | None) -> nn.Module:
    """The product module of one (possibly fused) weight [out, in]."""
    b = None if bias is None else dense(bias, dtype, device)
    if _kept_quantized(w, device) and w.qtype in SIXTEEN_TYPES:
        codes, scales = sixteen_operands(w)
        return Int4Linear(torch.from_numpy(codes), torch.from_numpy(scales), None, False, b,
                          group=16, factors=tuple(torch.from_numpy(a) for a in q6_factors(w)))
    if _kept_quantized(w, device):
        codes, scales, mins, doubled = kernel_operands(w)
        factors = (tuple(torch.from_numpy(a) for a in k_factors(w))
                   if w.qtype == "Q4_K" and int4_mm() else None)
        return Int4Linear(torch.from_numpy(codes), torch.from_numpy(scales),
                          torch.from_numpy(mins), doubled, b, factors=factors)
    weight = dense(w, dtype, device)
    if quantize is not None and _fits_kernel(tuple(weight.shape), device):
        codes, scales, mins, doubled = quantize_dense(weight.cpu(), quantize)
        return Int4Linear(torch.from_numpy(codes), torch.from_numpy(scales),
                          torch.from_numpy(mins), doubled, b)
    return DenseLinear(weight, b)


def fused_linear(parts: list, bias, dtype: torch.dtype, device, quantize: str | None
                 ) -> nn.Module:
    """One product over the rows of several weights (q|k|v, gate|up). Blocks of one format
    stay one matrix; blocks of several formats the kernels keep (Q4_K_M's q|k in Q4_K with v in
    Q6_K) stay quantized as one matrix per run of a format, their outputs side by side;
    anything else is one dense matrix."""
    if all(isinstance(p, Blocks) for p in parts):
        fused = concat_rows(parts)
        if fused is not None:
            return make_linear(fused, bias, dtype, device, quantize)
        runs = [concat_rows(list(run)) for _, run in groupby(parts, key=lambda p: p.qtype)]
        if all(_kept_quantized(run, device) for run in runs):
            biases = ([None] * len(runs) if bias is None
                      else bias.split([run.shape[0] for run in runs]))
            return RowParts([make_linear(run, b, dtype, device, quantize)
                             for run, b in zip(runs, biases)])
    return make_linear(torch.cat([dense(p, dtype, device) for p in parts]), bias, dtype, device,
                       quantize)


def _layer(t: dict, i: int, c: ModelConfig, dtype, device, quantize) -> dict:
    """One block's norms and product modules, taken out of `t` (so a checkpoint is not held
    twice while the network is built)."""
    p = f"layers.{i}."

    def get(name: str, shape: tuple[int, ...] | None = None):
        if p + name not in t:
            raise ValueError(f"checkpoint lacks tensor '{p + name}'")
        w = t.pop(p + name)
        if shape is not None and tuple(w.shape) != shape:
            raise ValueError(f"tensor '{p + name}' has shape {tuple(w.shape)}, "
                             f"config implies {shape}")
        return w

    def opt(name: str):
        return t.pop(p + name, None)

    def linear(w, bias=None) -> nn.Module:
        return make_linear(w, bias, dtype, device, quantize)

    def fused(parts: list, bias) -> nn.Module:
        return fused_linear(parts, bias, dtype, device, quantize)

    h, d = c.hidden_size, c.head_dim
    attn = "self_attn."
    qkv = [get(attn + "q_proj.weight", (c.num_heads * d, h)),
           get(attn + "k_proj.weight", (c.num_kv_heads * d, h)),
           get(attn + "v_proj.weight", (c.num_kv_heads * d, h))]
    biases = [opt(attn + f"{n}_proj.bias") for n in "qkv"]
    qkv_bias = None
    if any(b is not None for b in biases):
        qkv_bias = torch.cat([dense(b, dtype, device) if b is not None
                              else torch.zeros(w.shape[0], dtype=dtype, device=device)
                              for b, w in zip(biases, qkv)])
    gate_up = [get("mlp.gate_proj.weight", (c.intermediate_size, h)),
               get("mlp.up_proj.weight", (c.intermediate_size, h))]
    gate_bias = opt("mlp.gate_proj.bias")
    gate_up_bias = None if gate_bias is None else torch.cat(
        [dense(gate_bias, dtype, device), dense(get("mlp.up_proj.bias"), dtype, device)])
    w = {
        "attn_norm": dense(get("input_layernorm.weight", (h,)), dtype, device),
        "mlp_norm": dense(get("post_attention_layernorm.weight", (h,)), dtype, device),
        "wqkv": fused(qkv, qkv_bias),
        "wo": linear(get(attn + "o_proj.weight", (h, c.num_heads * d)), opt(attn + "o_proj.bias")),
        "w_gate_up": fused(gate_up, gate_up_bias),
        "w_down": linear(get("mlp.down_proj.weight", (h, c.intermediate_size)),
                         opt("mlp.down_proj.bias")),
    }
    if c.qk_norm:
        w["q_norm"] = dense(get(attn + "q_norm.weight", (d,)), dtype, device)
        w["k_norm"] = dense(get(attn + "k_norm.weight", (d,)), dtype, device)
    return w


def build_transformer(config: ModelConfig, tensors: dict, dtype: torch.dtype, device,
                      quantize: str | None = None) -> Transformer:
    """The network from checkpoint tensors (dense tensors or GGUF blocks). Consumes `tensors`."""
    if "embed_tokens.weight" not in tensors:
        raise ValueError("checkpoint lacks 'model.embed_tokens.weight'")
    embed_w = tensors.pop("embed_tokens.weight")
    expect = (config.vocab_size, config.hidden_size)
    if tuple(embed_w.shape) != expect:
        raise ValueError(f"embedding has shape {tuple(embed_w.shape)}, config implies {expect}")
    head_w = embed_w if config.tie_word_embeddings else tensors.pop("lm_head.weight")
    if tuple(head_w.shape) != expect:
        raise ValueError(f"lm_head has shape {tuple(head_w.shape)}, config implies {expect}")
    if "norm.weight" not in tensors:
        raise ValueError("checkpoint lacks 'model.norm.weight'")
    norm = dense(tensors.pop("norm.weight"), dtype, device)
    embed = dense(embed_w, dtype, device)
    if head_w is embed_w and not isinstance(embed_w, Blocks):
        head_w = embed                     # tied and dense: the head shares the embedding
    # a quantized head keeps 8 bits: the logits are its direct output
    head = make_linear(head_w, None, dtype, device, quantize and "q8")
    layers = [_layer(tensors, i, config, dtype, device, quantize)
              for i in range(config.num_layers)]
    return Transformer(config, embed, norm, head, layers)

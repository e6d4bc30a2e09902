"""Attention as the operator longspec::attention, and the decoder layers of a quantized CPU model
run by one compiled function.

Attention of a bfloat16 model on a CPU runs as native.cpp's loops (`loop_attention`, registered
as longspec::attention) at every length, for heads of a multiple of 16 (others take
attention.py's products): one arithmetic per position, whatever the run's length, so a
generation's first tokens do not depend on how long it will be. Every forward (prefill,
decoding, drafts) takes them, so the prompt's cache is what decoding would write and every row
is what its token gets alone. Against the products (oneDNN) they cost 0.2-0.66x on a CPU with
only AVX2 (300 to 4K positions) and 0.76-1.25x on AVX-512 without AMX (more than the products
past ~2K positions; docs/benchmarks/kernels.md). On CPUs with AVX-512's bfloat16 dot products (AMX
ones included) the loops sum with them, another arithmetic 1.4-1.5x faster from 2K positions
(compiled.py's AVX512_BF16 build).

A decoding step of SmolLM2-135M makes ~2,000 framework calls, most of them views, slices and
casts of a microsecond or two of work, and from Python each costs more than its work: a step's
products take ~6 ms of its ~18 (docs/benchmarks/kernels.md). For a quantized model native.cpp makes
the same calls in the same order from C++ (`Block.forward` with longspec::attention, chains and
draft trees alike), so its output is bitwise the Python layers' (tests/test_native.py) at ~0.6x the
time of a step.

It is compiled on first use (compiled.py). Without a C++ compiler, or with LONGSPEC_NATIVE=0 in
the environment, the layers run in Python.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import torch

from ..cache.base import AttentionPlan, KVCache
from .compiled import extension
from .linear import DenseLinear, Int4Linear, RowParts


def _products(net) -> list:
    """Every layer's four products in order: q|k|v, output, gate|up, down."""
    return [p for b in net.layers for p in (b.wqkv, b.wo, b.w_gate_up, b.w_down)]


def _pieces(product) -> list:
    """A product's modules: a RowParts' parts, or the product itself."""
    return list(product.parts) if isinstance(product, RowParts) else [product]


def _parts(module: ModuleType, product) -> list:
    """A product's parts as the compiled layers take them."""
    return [module.Part(weight=p.packed, scale_zero=p.scale_zero, size=p.group,
                        doubled=p.doubled, bias=p.bias) if isinstance(p, Int4Linear)
            else module.Part(weight=p.weight, scale_zero=None, size=p.min_rows, doubled=False,
                             bias=p.bias)
            for p in _pieces(product)]


class NativeLayers:
    """Every layer of a quantized `Transformer` (int4 products, and the dense ones of formats
    the kernel cannot take), bfloat16 on a CPU, handed to the compiled layers once:
    `__call__(x, cos, sin, parts, queries)` is what the Python loop over `Block`s gives: the
    output, and each layer's query of the last row when `queries` (else None)."""

    def __init__(self, module: ModuleType, net) -> None:
        c = net.config
        blocks = list(net.layers)
        self.module = module
        layers = self.layers = module.Layers()
        layers.norms = [t for b in blocks for t in (b.attn_norm, b.mlp_norm)]
        layers.qk_norms = ([] if blocks[0].q_norm is None
                           else [t for b in blocks for t in (b.q_norm, b.k_norm)])
        layers.products = [_parts(module, p) for p in _products(net)]
        layers.heads, layers.kv_heads, layers.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        layers.eps, layers.scale = c.rms_norm_eps, c.head_dim ** -0.5

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 parts: list[tuple[KVCache, AttentionPlan]], queries: bool
                 ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        segments = [self.module.Segment(keys=cache.k, values=cache.v, start=plan.start,
                                        n=plan.n_keys, rows=plan.q, mask=plan.block_mask,
                                        order=plan.block_order) for cache, plan in parts]
        out, last_queries = self.layers.forward(x, cos, sin, segments, queries)
        return out, last_queries if queries else None


def attention_loops(net) -> bool:
    """Whether `net`'s attention runs as longspec::attention: a bfloat16 model on a CPU, heads
    of a multiple of 16, and the compiled code built."""
    return (net.device.type == "cpu" and net.dtype == torch.bfloat16
            and net.config.head_dim % 16 == 0 and extension() is not None)


def attention_path(net) -> str:
    """Where `net`'s attention runs: "loops" (longspec::attention, attention_loops), "triton"
    (tree_attention.py's kernel: on CUDA where Triton is installed and takes the heads) or
    "products" (attention.py). LONGSPEC_ATTENTION=products or =triton in the environment
    chooses (triton on a CPU runs under TRITON_INTERPRET=1, for tests)."""
    chosen = os.environ.get("LONGSPEC_ATTENTION", "")
    if chosen not in ("", "products", "triton"):
        raise ValueError(f"LONGSPEC_ATTENTION={chosen!r}: use 'products' or 'triton', or unset it")
    c = net.config
    takes = importlib.util.find_spec("triton") is not None and tree_kernel_takes(
        c.num_heads, c.num_kv_heads, c.head_dim)
    if chosen == "triton":
        if not takes:
            raise ValueError("LONGSPEC_ATTENTION=triton needs the triton package and heads of a "
                             f"power-of-two size of at least 16 (this model's: {c.head_dim})")
        if net.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("LONGSPEC_ATTENTION=triton on a CPU needs TRITON_INTERPRET=1")
        return "triton"
    if chosen == "products":
        return "products"
    if attention_loops(net):
        return "loops"
    return "triton" if net.device.type == "cuda" and takes else "products"


def tree_kernel_takes(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether tree_attention.py's kernel takes these heads: a power-of-two size of at least
    16 (its products' tile), a whole query group per key/value head."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0 and heads % kv_heads == 0


def native_layers(net) -> NativeLayers | None:
    """The compiled layers for `net` where they apply: a model whose attention runs as
    longspec::attention, with int4 products (a quantized GGUF or `--quantize`) and no dense
    product as oneDNN's inner product (linear.py: bfloat16 on AVX-512 without bfloat16
    instructions; the compiled layers make dense products as F.linear); otherwise None."""
    products = _products(net)
    if net.attention != "loops" or not any(isinstance(p, Int4Linear) for p in products):
        return None
    if any(isinstance(q, DenseLinear) and q.inner_product for p in products for q in _pieces(p)):
        return None
    return NativeLayers(extension(), net)

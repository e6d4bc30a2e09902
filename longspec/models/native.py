"""The decoder layers of a quantized CPU model, run by one compiled function.

A decoding step of SmolLM2-135M makes ~2,000 framework calls, most of them views, slices and
casts of a microsecond or two of work, and from Python each costs more than its work: a step's
products take ~6 ms of its ~18 (BENCHMARKS.md). native.cpp makes the same ATen calls in the same
order from C++ (`Block.forward` with `grouped_attention`, chains and draft trees alike), so its
output is bitwise the Python path's (tests/test_native.py) at ~0.6× the time of a step.

For generations of up to LOOP_CONTEXT positions (longer where the CPU has AMX tiles: below),
attention runs as native.cpp's loops instead (`loop_attention`): two small bfloat16 products
cost ~25 us each a layer through oneDNN whatever their size, the loops a few at short contexts.
Every forward of such a generation (prefill, decoding, drafts) takes them, so the prompt's cache
is what decoding would write and every row is what its token gets alone; their output is within
bfloat16 rounding of the Python path's, not bitwise it.

It is compiled on first use (compiled.py). Without a C++ compiler, or with LONGSPEC_NATIVE=0 in
the environment, the layers run in Python.
"""

from __future__ import annotations

from types import ModuleType

import torch

from ..cache.base import CHUNK, AttentionPlan, KVCache
from .compiled import amx_int4, extension
from .linear import Int4Linear, min_rows

# Longest sequence whose attention runs as native.cpp's loops: below it they cost less than
# oneDNN's products (a fixed ~25 us a product), above it more (BENCHMARKS.md). On AMX tiles
# the loops cost less: with the scores on them (heads of a multiple of 32) they pay up to ~3K
# positions, with p . v too (a multiple of 64) at every length measured (to 16K).
LOOP_CONTEXT = 2048
TILE_LOOP_CONTEXT = 3072


def _products(net) -> list:
    """Every layer's four products in order: q|k|v, output, gate|up, down."""
    return [p for b in net.layers for p in (b.wqkv, b.wo, b.w_gate_up, b.w_down)]


class NativeLayers:
    """Every layer of a quantized `Transformer` (int4 products, and the dense ones of formats
    the kernel cannot take), bfloat16 on a CPU: `__call__(x, cos, sin, cache, plan, queries)`
    is what the Python loop over `Block`s gives: the output, and each layer's query of the last
    token when `queries` (else None)."""

    def __init__(self, module: ModuleType, net) -> None:
        self.module = module
        self.config = c = net.config
        blocks = list(net.layers)
        products = _products(net)
        self.norms = [t for b in blocks for t in (b.attn_norm, b.mlp_norm)]
        self.qk_norms = ([] if blocks[0].q_norm is None
                         else [t for b in blocks for t in (b.q_norm, b.k_norm)])
        int4 = [isinstance(p, Int4Linear) for p in products]
        self.weights = [p.packed if q else p.weight for p, q in zip(products, int4)]
        self.scale_zero = [p.scale_zero if q else None for p, q in zip(products, int4)]
        self.sizes = [p.group if q else p.min_rows for p, q in zip(products, int4)]
        self.doubled = [q and p.doubled for p, q in zip(products, int4)]
        self.bias = [p.bias for p in products]
        self.bucket_rows = min_rows(c.head_dim, CHUNK)
        self.scale = c.head_dim ** -0.5
        self.loops = False
        self.tiles = amx_int4() is not None     # the loops' scores (and p . v) on AMX tiles
        # the longest sequence the loops run (None: any)
        self.loop_context = (LOOP_CONTEXT if not self.tiles or c.head_dim % 32
                             else TILE_LOOP_CONTEXT if c.head_dim % 64 else None)

    def set_context(self, seq_len: int) -> None:
        """Attention as loops for sequences of up to `loop_context` positions, else as
        products (every forward of a generation the same way: prefill, decoding, drafts)."""
        self.loops = ((self.loop_context is None or seq_len <= self.loop_context)
                      and self.config.head_dim % 16 == 0)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
                 plan: AttentionPlan, queries: bool
                 ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        c = self.config
        rows = c.num_heads // c.num_kv_heads * x.shape[0]
        out, last_queries = self.module.layers(
            x, cos, sin, self.norms, self.qk_norms, self.weights, self.scale_zero, self.sizes,
            self.doubled, self.bias, cache.k, cache.v, plan.start, plan.n_keys, plan.block_mask,
            plan.block_order, c.num_heads, c.num_kv_heads, c.head_dim, max(rows, self.bucket_rows),
            c.rms_norm_eps, self.scale, queries, self.loops, self.tiles)
        return out, last_queries if queries else None


def native_layers(net) -> NativeLayers | None:
    """The compiled layers for `net` where they apply: a CPU model in bfloat16 with int4
    products (a quantized GGUF or `--quantize`); otherwise None."""
    if net.device.type != "cpu" or net.dtype != torch.bfloat16:
        return None
    if not any(isinstance(p, Int4Linear) for p in _products(net)):
        return None
    module = extension()
    return None if module is None else NativeLayers(module, net)

"""Exact tree attention in one Triton kernel per layer (and a small combine): the attention path
of a model on CUDA, where every row of a draft tree must be bitwise what its token gets alone.

A row's keys are the committed cache [0, start) and then its own tail: its ancestors in depth
order and itself, at logical positions start, start + 1, ... (`tail[r, j]` names the block
slot holding the row's j-th visible block key, `count[r]` how many it has). Run alone after
those ancestors were committed, the same token sees the same keys at the same logical
positions. The kernel reads the keys by logical position, in fixed absolute blocks:

- one program per (TILE rows, key/value head, split of SPLIT x CHUNK slots) folds its blocks
  of BLOCK keys in order with the online softmax (running max, sum and weighted values in
  float32); no score tensor is ever stored. The rows of a tile hold their own states and
  their own products (a batched dot, one batch entry a row), and read the committed keys at the
  same addresses, so those come from the GPU's memory once for the tile (with a row a
  program, a tree read the cache once a row: on an H200, 16 rows over 100K positions cost 2.5x
  one row, 64 rows 6.8x; BENCHMARKS.md);
- one program per (row, key/value head) folds the splits' partials in order.

Every lane of a chunk is computed the same way whatever the other rows of the forward are
(masked lanes read zeros and score -inf), each batch entry of a product holds one token's
group of query heads alone, a row folds blocks past its own keys as no-ops (they add zero and
scale by one), and the number of chunks and splits a row folds depends on its own length only.
A single token runs in a tile of its own, padded. So a row's bits are a function of its token,
its keys and its position: the same in a tree of 64 nodes, in a chain, or alone. Under
TRITON_INTERPRET=1 the same kernels run on a CPU (the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..cache.base import CHUNK
from ..memory import upload

BLOCK = 32    # keys a fold step reads: a [TILE, rows, BLOCK] score tile, never stored
SPLIT = 4     # CHUNKs of keys one program folds before its partial is stored
TILE = 4      # tree rows a program folds side by side: the committed keys read once for all


@triton.jit
def _split_partials(q_ptr, k_ptr, v_ptr, tail_ptr, count_ptr, m_ptr, l_ptr, acc_ptr,
                    start_ptr, scale, q_len, splits, heads_all,
                    sq_t, sq_h, sk_h, sk_s, sv_h, sv_s, s_tail,
                    GROUP: tl.constexpr, ROWS: tl.constexpr, TILE_: tl.constexpr,
                    D: tl.constexpr, BLOCK_: tl.constexpr, SPAN: tl.constexpr,
                    IEEE: tl.constexpr):
    tile = tl.program_id(0)
    kv = tl.program_id(1)
    split = tl.program_id(2)
    # int32 throughout (the layouts and the length come as int32 or int64), so the loop's
    # bounds and the slots share one type
    start = tl.load(start_ptr).to(tl.int32)
    r = tile * TILE_ + tl.arange(0, TILE_)                                   # [TILE] rows
    live = r < q_len
    n = tl.where(live, start + tl.load(count_ptr + r, mask=live, other=0).to(tl.int32), 0)
    first = split * SPAN
    longest = tl.max(n)
    if first < longest:
        g = tl.arange(0, ROWS)
        d = tl.arange(0, D)
        heads = kv * GROUP + g
        q = tl.load(q_ptr + r[:, None, None] * sq_t + heads[None, :, None] * sq_h
                    + d[None, None, :],
                    mask=live[:, None, None] & (g < GROUP)[None, :, None], other=0.0)
        m_run = tl.full((TILE_, ROWS), float("-inf"), tl.float32)
        l_run = tl.zeros((TILE_, ROWS), tl.float32)
        acc = tl.zeros((TILE_, ROWS, D), tl.float32)                          # [TILE, ROWS, D]
        for base in range(first, tl.minimum(longest, first + SPAN), BLOCK_):
            pos = base + tl.arange(0, BLOCK_)[None, :]               # logical positions [1, B]
            valid = pos < n[:, None]                                          # [TILE, BLOCK]
            in_tail = valid & (pos >= start)
            node = tl.load(tail_ptr + r[:, None] * s_tail + (pos - start), mask=in_tail,
                           other=0).to(tl.int32)
            slot = tl.where(in_tail, start + node, pos)
            keys = tl.load(k_ptr + kv * sk_h + slot[:, :, None] * sk_s + d[None, None, :],
                           mask=valid[:, :, None], other=0.0)               # [TILE, BLOCK, D]
            if IEEE:
                s = tl.dot(q, tl.trans(keys, (0, 2, 1)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(keys, (0, 2, 1)))
            s = tl.where(valid[:, None, :], s * scale, float("-inf"))   # [TILE, ROWS, BLOCK]
            m_new = tl.maximum(m_run, tl.max(s, 2))
            p = tl.exp(s - m_new[:, :, None])
            alpha = tl.exp(m_run - m_new)
            values = tl.load(v_ptr + kv * sv_h + slot[:, :, None] * sv_s + d[None, None, :],
                             mask=valid[:, :, None], other=0.0)
            if IEEE:
                pv = tl.dot(p, values, input_precision="ieee")
            else:
                pv = tl.dot(p.to(values.dtype), values)
            l_run = l_run * alpha + tl.sum(p, 2)
            acc = acc * alpha[:, :, None] + pv
            m_run = m_new
        at = ((r[:, None] * heads_all + heads[None, :]) * splits + split)     # [TILE, ROWS]
        keep = (first < n)[:, None] & (g < GROUP)[None, :]
        tl.store(m_ptr + at, m_run, mask=keep)
        tl.store(l_ptr + at, l_run, mask=keep)
        tl.store(acc_ptr + at[:, :, None] * D + d[None, None, :], acc, mask=keep[:, :, None])


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, count_ptr, out_ptr, start_ptr, splits, heads_all,
             GROUP: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, SPAN: tl.constexpr):
    row = tl.program_id(0)
    kv = tl.program_id(1)
    n = tl.load(start_ptr).to(tl.int32) + tl.load(count_ptr + row).to(tl.int32)
    used = (n + SPAN - 1) // SPAN
    g = tl.arange(0, ROWS)
    d = tl.arange(0, D)
    keep = g < GROUP
    at = (row * heads_all + kv * GROUP + g) * splits                               # [ROWS]
    m_run = tl.full((ROWS,), float("-inf"), tl.float32)
    l_run = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, D), tl.float32)
    for s in range(used):
        m = tl.load(m_ptr + at + s, mask=keep, other=0.0)
        m_new = tl.maximum(m_run, m)
        alpha = tl.exp(m_run - m_new)
        beta = tl.exp(m - m_new)
        l_run = l_run * alpha + tl.load(l_ptr + at + s, mask=keep, other=1.0) * beta
        part = tl.load(acc_ptr + (at + s)[:, None] * D + d[None, :], mask=keep[:, None],
                       other=0.0)
        acc = acc * alpha[:, None] + part * beta[:, None]
        m_run = m_new
    out = acc / l_run[:, None]
    tl.store(out_ptr + row * heads_all * D + (kv * GROUP + g)[:, None] * D + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=keep[:, None])


def tree_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   start: int | torch.Tensor, layout: tuple[torch.Tensor, torch.Tensor],
                   scale: float) -> torch.Tensor:
    """Attention of q [q_len, heads, d] over the cache views keys/values [kv_heads, n, d]
    (committed slots [0, start), the block after them), each row over its block layout
    (attention.block_layout) -> [q_len, heads * d]. `start` may be a device tensor [1] (a
    captured step): the launch then covers all n slots, programs past a row's keys exit."""
    q_len, heads, d = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    tail, count = layout
    span = SPLIT * CHUNK
    if isinstance(start, torch.Tensor):
        splits = -(-keys.shape[1] // span)
    else:
        splits = -(-(start + q_len) // span)
        start = upload([start], q.device)
    m = torch.empty(q_len, heads, splits, dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty(q_len, heads, splits, d, dtype=torch.float32, device=q.device)
    rows = max(16, triton.next_power_of_2(group))   # a product's fewest rows; the rest masked
    tile = TILE if keys.element_size() <= 2 else TILE // 2     # float32: within shared memory
    _split_partials[(-(-q_len // tile), kv_heads, splits)](
        q, keys, values, tail, count, m, l_sum, acc, start, scale, q_len, splits, heads,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), values.stride(0),
        values.stride(1), tail.stride(0),
        GROUP=group, ROWS=rows, TILE_=tile, D=d, BLOCK_=BLOCK, SPAN=span,
        IEEE=keys.dtype == torch.float32, num_warps=8)
    out = torch.empty(q_len, heads * d, dtype=q.dtype, device=q.device)
    _combine[(q_len, kv_heads)](m, l_sum, acc, count, out, start, splits, heads, GROUP=group,
                                ROWS=rows, D=d, SPAN=span)
    return out

"""Exact tree attention in one Triton kernel per layer (and a small combine): the attention path
of a model on CUDA, where every row of a draft tree must be bitwise what its token gets alone.

A row's keys are the committed cache [0, start) and then its own tail: its ancestors in depth
order and itself, at logical positions start, start + 1, ... (`tail[r, j]` names the block
slot holding the row's j-th visible block key, `count[r]` how many it has). Run alone after
those ancestors were committed, the same token sees the same keys at the same logical
positions. The kernel reads the keys by logical position, in fixed absolute blocks:

- one program per (row, key/value head, split of SPLIT x CHUNK slots) folds its blocks of BLOCK
  keys in order with the online softmax (running max, sum and weighted values in float32); no
  score tensor is ever stored. Programs of the rows of one split are launched side by side, so
  a tree's rows read the committed keys from the GPU's memory about once;
- one program per (row, key/value head) folds the splits' partials in order.

Every lane of a chunk is computed the same way whatever the other rows of the forward are
(masked lanes read zeros and score -inf), each program holds one token's group of query heads
alone, and the number of chunks and splits a row folds depends on its own length only. So a
row's bits are a function of its token, its keys and its position: the same in a tree of 64
nodes, in a chain, or alone. Under TRITON_INTERPRET=1 the same kernels run on a CPU (the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..cache.base import CHUNK
from ..device.memory import upload

BLOCK = 64    # keys a fold step reads: a [rows, BLOCK] score tile, never stored
SPLIT = 4     # CHUNKs of keys one program folds before its partial is stored


@triton.jit
def _split_partials(q_ptr, k_ptr, v_ptr, tail_ptr, count_ptr, m_ptr, l_ptr, acc_ptr,
                    start_ptr, scale, splits, heads_all,
                    sq_t, sq_h, sk_h, sk_s, sv_h, sv_s, s_tail,
                    GROUP: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                    BLOCK_: tl.constexpr, SPAN: tl.constexpr, IEEE: tl.constexpr):
    row = tl.program_id(0)
    kv = tl.program_id(1)
    split = tl.program_id(2)
    # int32 throughout (the layouts and the length come as int32 or int64), so the loop's
    # bounds and the slots share one type
    start = tl.load(start_ptr).to(tl.int32)
    n = start + tl.load(count_ptr + row).to(tl.int32)      # keys the row attends to
    first = split * SPAN
    if first < n:
        g = tl.arange(0, ROWS)
        d = tl.arange(0, D)
        heads = kv * GROUP + g
        q = tl.load(q_ptr + row * sq_t + heads[:, None] * sq_h + d[None, :],
                    mask=(g < GROUP)[:, None], other=0.0)                  # [ROWS, D]
        m_run = tl.full((ROWS,), float("-inf"), tl.float32)
        l_run = tl.zeros((ROWS,), tl.float32)
        acc = tl.zeros((ROWS, D), tl.float32)
        end = tl.minimum(n, first + SPAN)
        for base in range(first, end, BLOCK_):
            pos = base + tl.arange(0, BLOCK_)                                 # logical positions
            valid = pos < n
            in_tail = valid & (pos >= start)
            node = tl.load(tail_ptr + row * s_tail + (pos - start), mask=in_tail,
                           other=0).to(tl.int32)
            slot = tl.where(in_tail, start + node, pos)
            keys = tl.load(k_ptr + kv * sk_h + slot[:, None] * sk_s + d[None, :],
                           mask=valid[:, None], other=0.0)                    # [BLOCK, D]
            if IEEE:
                s = tl.dot(q, tl.trans(keys), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(keys))
            s = tl.where(valid[None, :], s * scale, float("-inf"))           # [ROWS, BLOCK]
            m_new = tl.maximum(m_run, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_run - m_new)
            values = tl.load(v_ptr + kv * sv_h + slot[:, None] * sv_s + d[None, :],
                             mask=valid[:, None], other=0.0)
            if IEEE:
                pv = tl.dot(p, values, input_precision="ieee")
            else:
                pv = tl.dot(p.to(values.dtype), values)
            l_run = l_run * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + pv
            m_run = m_new
        at = (row * heads_all + heads) * splits + split                          # [ROWS]
        keep = g < GROUP
        tl.store(m_ptr + at, m_run, mask=keep)
        tl.store(l_ptr + at, l_run, mask=keep)
        tl.store(acc_ptr + at[:, None] * D + d[None, :], acc, mask=keep[:, None])


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
    _split_partials[(q_len, kv_heads, splits)](
        q, keys, values, tail, count, m, l_sum, acc, start, scale, splits, heads,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), values.stride(0),
        values.stride(1), tail.stride(0),
        GROUP=group, ROWS=rows, D=d, BLOCK_=BLOCK, SPAN=span, IEEE=keys.dtype == torch.float32)
    out = torch.empty(q_len, heads * d, dtype=q.dtype, device=q.device)
    _combine[(q_len, kv_heads)](m, l_sum, acc, count, out, start, splits, heads, GROUP=group,
                                ROWS=rows, D=d, SPAN=span)
    return out

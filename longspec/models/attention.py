"""Grouped-query attention whose every row is bitwise what the same token gets run alone, as
products: for float32 models, on CUDA, for heads not of a multiple of 16, and without the
compiled code (bfloat16 models on a CPU otherwise take longspec::attention's loops, native.py).

A draft tree's node attends over the cache and its ancestors; run alone after those
ancestors, the same token attends over the cache and the same keys at consecutive slots. For
the two to agree bit for bit, no reduction may change its shape or order with the number of
tokens in the forward or with where the block sits:

- rows: the group x q query rows of a key/value head go through one product. float32 products
  (MKL) give rows of 1-3, 5-7 and 9-11 their own kernels, so there the row count is rounded up
  (4, 8, 12, then exact). bfloat16 products run in oneDNN only when rows x K x columns exceeds
  16^3 (PyTorch's threshold), below it in a plain loop that rounds otherwise: a 1-token forward
  at a short context (3 rows x 64 x 14 keys) and a 2-token one (6 rows) took different paths
  and gave different scores. So products are kept above it: at least `min_rows` rows.
- scores q.k: the keys are read padded to a multiple of CHUNK slots (MKL computes the last
  n mod 8 float32 columns its own way; for bfloat16 it keeps the product above the threshold).
- softmax: every row is padded with -inf to the chunked length (softmax reduces lane-wise, so
  trailing -inf change nothing, but rows shorter than a vector take another path).
- tree rows: each row's block columns are reordered so its ancestors come first, in depth
  order, and the masked rest last, which is how the row looks for the token run alone.
- probabilities x values: split into CHUNK-slot chunks of absolute positions, each chunk one
  [rows, CHUNK] x [CHUNK, d] product, the partials summed by a fixed pairwise tree (trailing
  zero partials change nothing). Tree rows read, in the chunks past the cache, their own
  ancestors' values at their logical positions.
Keys are never replicated across the query group, and the cache's buffers are allocated in
whole chunks (cache/base.py), so reading a chunk's padding slots stays in bounds; those slots
hold finite values that get probability 0.
"""

from __future__ import annotations

import torch

from ..cache.base import CHUNK
from .linear import min_rows


def block_order(mask: torch.Tensor | None) -> torch.Tensor | None:
    """[q, q] long: each row's visible block slots in order, then the masked ones; None when
    that is the identity (a causal chain) or there is no mask."""
    if mask is None:
        return None
    q = mask.shape[0]
    order = torch.argsort((mask != 0).to(torch.int8), dim=-1, stable=True)
    if torch.equal(order, torch.arange(q, device=mask.device).expand(q, q)):
        return None
    return order


def block_layout(mask: torch.Tensor | None, q_len: int, device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """tail [q, q] int32 (each row's visible block slots in slot order, which for a draft tree
    is its ancestors in depth order, then the rest) and count [q] int32 (how many it sees),
    from the block's additive [q, q] mask (None: every row sees the whole block)."""
    if mask is None:
        tail = torch.arange(q_len, dtype=torch.int32, device=device).expand(q_len, q_len)
        return tail.contiguous(), torch.full((q_len,), q_len, dtype=torch.int32, device=device)
    hidden = (mask != 0).to(torch.int8)
    tail = torch.argsort(hidden, dim=-1, stable=True).to(torch.int32)
    return tail, (q_len - hidden.sum(-1)).to(torch.int32)


def pairwise_sum(parts: torch.Tensor) -> torch.Tensor:
    """Sum over dim 0 by a pairwise tree over a power-of-two count (zero-padded): a fixed
    order in which trailing zero partials leave every other subtree as it is."""
    n = parts.shape[0]
    size = 1 << (n - 1).bit_length()
    if size > n:
        parts = torch.cat([parts, parts.new_zeros(size - n, *parts.shape[1:])])
    while parts.shape[0] > 1:
        parts = parts[0::2] + parts[1::2]
    return parts[0]


def _row_bucket(m: int) -> int:
    return 4 if m <= 4 else 8 if m <= 8 else max(12, m)


def _slots(buf: torch.Tensor, n: int) -> torch.Tensor:
    """A view of the first n slots of a cache buffer view [kv, >= its length, d] (n may pass
    the view's length, never the allocation)."""
    return buf.as_strided((buf.shape[0], n, buf.shape[2]), buf.stride())


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                      mask: torch.Tensor | None, order: torch.Tensor | None,
                      scale: float) -> torch.Tensor:
    """Attention of q [q_len, heads, d] over keys/values [kv_heads, n, d] (views of the cache,
    the block at slots start..start + q_len) -> [q_len, heads * d]. `mask` is the block's
    additive [q, q] mask, `order` its `block_order`. Every key/value head goes through the same
    batched products (a head's rows are what a product of that head alone gives)."""
    q_len, heads, d = q.shape
    kv_heads, n = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    rows = group * q_len
    fp32 = keys.dtype == torch.float32
    padded = -(-n // CHUNK) * CHUNK
    qg = q.view(q_len, kv_heads, group, d).permute(1, 2, 0, 3).reshape(kv_heads, rows, d)
    bucket = _row_bucket(rows) if fp32 else max(rows, min_rows(d, CHUNK))
    if bucket > rows:
        qg = torch.cat([qg, qg.new_zeros(kv_heads, bucket - rows, d)], 1)
    keys = _slots(keys, padded)
    values = _slots(values, padded)
    shared = padded // CHUNK if order is None else start // CHUNK   # chunks every row reads
    s = torch.bmm(qg, keys.transpose(1, 2))                           # [kv, bucket, padded]
    s = s.mul_(scale) if fp32 else s.float().mul_(scale)
    s[..., n:] = float("-inf")
    if mask is not None:
        block = s[:, :rows].view(kv_heads, group, q_len, padded)[..., start:start + q_len]
        if order is None:
            block += mask
        else:
            block.copy_(block.gather(-1, order.expand(kv_heads, group, q_len, q_len))
                        + mask.gather(-1, order))
    p = torch.softmax(s, dim=-1).to(torch.float32 if fp32 else values.dtype)
    parts = []
    if shared:
        chunks = p[..., :shared * CHUNK].view(kv_heads, bucket, shared, CHUNK).transpose(1, 2)
        vals = values[:, :shared * CHUNK].reshape(kv_heads * shared, CHUNK, d)
        out = torch.bmm(chunks.reshape(kv_heads * shared, bucket, CHUNK), vals)
        parts.append(out.view(kv_heads, shared, bucket, d)[:, :, :rows].float())
    if order is not None:
        parts.append(_tree_tail(p, values, order, rows=rows, group=group, q_len=q_len,
                                shared=shared, padded=padded, start=start, fp32=fp32))
    partials = parts[0] if len(parts) == 1 else torch.cat(parts, 1)          # [kv, chunks, ...]
    out = pairwise_sum(partials.transpose(0, 1)).to(q.dtype)                   # [kv, rows, d]
    return out.view(kv_heads, group, q_len, d).permute(2, 0, 1, 3).reshape(q_len, heads * d)


def _tree_tail(p, values, order, *, rows, group, q_len, shared, padded, start, fp32):
    """Partials [kv, chunks, rows, d] of the chunks past the shared ones, each token's own:
    its probabilities [group, tail] against the values of its logical layout [tail, d], where
    the block's slots hold its ancestors first (`order`)."""
    kv_heads, d = values.shape[0], values.shape[2]
    tail_len = padded - shared * CHUNK
    chunks = tail_len // CHUNK
    index = torch.arange(shared * CHUNK, padded, device=p.device).repeat(q_len, 1)
    at = start - shared * CHUNK
    index[:, at:at + q_len] = start + order                              # ancestors first
    group_rows = _row_bucket(group) if fp32 else group
    pt = p[:, :rows, shared * CHUNK:].view(kv_heads, group, q_len, tail_len).transpose(1, 2)
    if group_rows > group:
        pt = torch.cat([pt, pt.new_zeros(kv_heads, q_len, group_rows - group, tail_len)], 2)
    pt = pt.reshape(kv_heads, q_len, group_rows, chunks, CHUNK).transpose(2, 3)
    pt = pt.reshape(kv_heads * q_len * chunks, group_rows, CHUNK)
    # index_select copies whole value rows (~4x faster than indexing with the 2-D index)
    tail_values = values.index_select(1, index.flatten())
    tail = torch.bmm(pt, tail_values.view(kv_heads * q_len * chunks, CHUNK, d))
    tail = tail.view(kv_heads, q_len, chunks, group_rows, d)[..., :group, :]
    return tail.permute(0, 2, 3, 1, 4).reshape(kv_heads, chunks, rows, d).float()

"""A compact Llama-family transformer for batch-size-one decoding over an external KV cache.

One sequence, no batch dimension: activations are [q, hidden] for q new tokens. Query, key and
value projections are fused into one matrix, as are the gate and up projections, so a decode
step runs few, large kernels. Grouped-query attention multiplies each key/value head with its
group of query heads directly, never replicating keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..cache.base import AttentionPlan, KVCache
from ..step.forward import ForwardOutput, TopTokens
from .attention import block_layout, block_order, grouped_attention
from .config import ModelConfig
from .linear import DenseLinear, Int4Linear
from .native import attention_path, native_layers
from .rope import apply_rope, dynamic_frequencies, rope_cos_sin, rope_frequencies

# an LM head: normed hidden states [n, hidden] -> logits [n, vocab]
Head = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Segment:
    """One generation's block in a forward of several: its tokens [q] at positions [q] into
    its own cache, with the block's additive mask [q, q] (None: every row sees the block)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    cache: KVCache
    mask: torch.Tensor | None = None


def _frozen(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t, requires_grad=False)


class Block(nn.Module):
    """One decoder layer: pre-norm attention and SwiGLU MLP, each with a residual. The four
    matrix products (fused q|k|v, output, fused gate|up, down) are modules of linear.py, dense
    or quantized, biases included."""

    def __init__(self, config: ModelConfig, w: dict):
        super().__init__()
        self.config = config
        self.attn_norm = _frozen(w["attn_norm"])
        self.q_norm = _frozen(w.get("q_norm"))
        self.k_norm = _frozen(w.get("k_norm"))
        self.mlp_norm = _frozen(w["mlp_norm"])
        self.wqkv, self.wo = w["wqkv"], w["wo"]
        self.w_gate_up, self.w_down = w["w_gate_up"], w["w_down"]

    def forward(self, x, cos, sin, layer: int, parts: list[tuple[KVCache, AttentionPlan]],
                attention: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output [q, hidden] and its rotated queries [q, heads, head_dim]. The
        rows of x are the parts' in turn (a cache and its plan each: several generations'
        blocks in one forward): every product runs over all rows, attention over each part's
        own cache, on the path `attention` names (native.attention_path): the plan's `layout`
        present, "triton" runs tree_attention.py's kernel."""
        c = self.config
        q_len = x.shape[0]
        eps = c.rms_norm_eps
        h = F.rms_norm(x, (c.hidden_size,), self.attn_norm, eps)
        qkv = self.wqkv(h)
        nq, nkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        qk = qkv[:, :nq + nkv].view(q_len, c.num_heads + c.num_kv_heads, c.head_dim)
        v = qkv[:, nq + nkv:].view(q_len, c.num_kv_heads, c.head_dim)
        if self.q_norm is not None:
            qk = torch.cat([F.rms_norm(qk[:, :c.num_heads], (c.head_dim,), self.q_norm, eps),
                            F.rms_norm(qk[:, c.num_heads:], (c.head_dim,), self.k_norm, eps)],
                           dim=1)
        qk = apply_rope(qk, cos, sin)            # queries and keys rotated in one go
        q, k = qk[:, :c.num_heads], qk[:, c.num_heads:]
        scale = c.head_dim ** -0.5
        outs, row = [], 0
        for cache, plan in parts:
            rows = slice(row, row + plan.q)
            row += plan.q
            keys, values = cache.write(layer, plan, k[rows].transpose(0, 1),
                                       v[rows].transpose(0, 1))
            if plan.layout is not None:
                from .tree_attention import tree_attention  # imports Triton: only on this path
                outs.append(tree_attention(q[rows], keys, values, plan.start, plan.layout, scale))
            else:
                products = (torch.ops.longspec.attention if attention == "loops"
                            else grouped_attention)
                outs.append(products(q[rows], keys, values, plan.start, plan.block_mask,
                                     plan.block_order, scale))
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        x = x + self.wo(out)
        h = F.rms_norm(x, (c.hidden_size,), self.mlp_norm, eps)
        gate, up = self.w_gate_up(h).chunk(2, dim=-1)
        return x + self.w_down(F.silu(gate) * up), q


class Transformer(nn.Module):
    """forward(tokens, positions, cache, mask) -> logits (+ final hidden states)."""

    def __init__(self, config: ModelConfig, embed: torch.Tensor, norm: torch.Tensor,
                 lm_head: nn.Module, layers: list[dict]):
        """embed [vocab, hidden] dense; lm_head a module of linear.py (the embedding's
        product when tied); `layers` as `Block` takes them."""
        super().__init__()
        self.config = config
        self.embed = _frozen(embed)
        self.norm = _frozen(norm)
        self.lm_head = lm_head
        self._head_read_back: torch.Tensor | None = None   # dense_head of a quantized head
        self.layers = nn.ModuleList(Block(config, w) for w in layers)
        self.attention = attention_path(self)   # "loops", "triton" or "products" (native.py)
        self.native = native_layers(self)   # the compiled layers, where they apply
        inv_freq, self.rope_scale = rope_frequencies(config.rope, config.head_dim)
        self.inv_freq = inv_freq.to(self.device)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def quantized(self) -> bool:
        return any(isinstance(m, Int4Linear) for m in self.modules())

    def dense_head(self) -> torch.Tensor:
        """The LM head as a dense [vocab, hidden] matrix (for training heads and drafters)."""
        if self.config.tie_word_embeddings:
            return self.embed
        if isinstance(self.lm_head, DenseLinear):
            return self.lm_head.dense_weight
        if self._head_read_back is None:
            # a quantized head's weights read back through its own product: the rows of the
            # identity give W's columns, each weight times one (int4_mm's int8 activations hold
            # 1 and 0 exactly), once per model (a drafter's head is a part of it)
            eye = torch.eye(self.config.hidden_size, dtype=self.dtype, device=self.device)
            self._head_read_back = self.lm_head(eye).t().contiguous()
        return self._head_read_back

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [q, 1, head_dim] of positions [q]: a function of each position
        alone (rope.py)."""
        c = self.config
        inv_freq = self.inv_freq
        if c.rope.type == "dynamic":
            inv_freq = dynamic_frequencies(c.rope, c.head_dim, c.max_positions, inv_freq,
                                           positions)
        return rope_cos_sin(positions, inv_freq, self.rope_scale, self.dtype)

    def rotate_keys(self, keys: torch.Tensor, delta: int) -> torch.Tensor:
        """Cached keys [kv_heads, n, head_dim] moved by `delta` positions (a pure rotation:
        the keys keep any scale their first rotation gave them; under dynamic scaling, by the
        trained length's frequencies)."""
        cos, sin = rope_cos_sin(torch.tensor([delta], device=keys.device), self.inv_freq, 1.0,
                                keys.dtype)
        return apply_rope(keys, cos, sin)

    def hidden_to_logits(self, hidden: torch.Tensor, head: Head | None = None) -> torch.Tensor:
        """Final norm and LM head (or `head`: one over part of the vocabulary):
        [n, hidden] -> [n, vocab]."""
        h = F.rms_norm(hidden, (self.config.hidden_size,), self.norm, self.config.rms_norm_eps)
        return (self.lm_head if head is None else head)(h)

    def _plan(self, q: int, cache: KVCache, mask: torch.Tensor | None) -> AttentionPlan:
        """The cache's plan for q new tokens, with what this network's attention reads of the
        block mask: its layout for the Triton kernel, else its rows' order."""
        plan = cache.plan(q, mask)
        if self.attention == "triton" and plan.n_keys == plan.start + plan.q:
            # keys the committed slots then the block (a cache that keeps a subset of the
            # history may leave visible slots after the block: those take the products)
            return dataclasses.replace(plan, layout=block_layout(mask, q, self.device))
        return dataclasses.replace(plan, block_order=block_order(mask))

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                mask: torch.Tensor | None = None, *,
                logits_index: torch.Tensor | slice | None = None, return_hidden: bool = False,
                need_logits: bool = True, return_queries: bool = False, head: Head | None = None,
                plan: AttentionPlan | None = None) -> ForwardOutput:
        """Run q new tokens [q] at `positions` [q] against `cache`.

        `mask` is the additive [q, q] mask of the block (causal, or a draft tree's ancestors);
        None lets every new token see the whole block. `logits_index` selects the positions
        whose logits are computed (default: all), by `head` when given (hidden_to_logits).
        A `plan` given (a captured step's: models/graphs.py) is used as it is, mask unread.
        """
        if plan is None:
            plan = self._plan(tokens.shape[0], cache, mask)
        x, queries = self._layers(tokens, positions, [(cache, plan)], return_queries)
        logits = None
        if need_logits:
            selected = x if logits_index is None else x[logits_index]
            logits = self.hidden_to_logits(selected, head)
        return ForwardOutput(logits, x if return_hidden else None, queries)

    @torch.no_grad()
    def forward_many(self, segments: list[Segment], return_hidden: bool = False,
                     plans: list[AttentionPlan] | None = None) -> list[ForwardOutput]:
        """Several generations' blocks in one forward (batched verification): each segment's
        output is what `forward` gives it alone, bit for bit, since every product is
        row-invariant (the row check at load: selfcheck.py) and attention reads each segment's
        own cache. Logits for every row. `plans` given (a captured step's: models/graphs.py),
        one a segment, are used as they are, masks unread."""
        if plans is None:
            plans = [self._plan(s.tokens.shape[0], s.cache, s.mask) for s in segments]
        parts = [(s.cache, plan) for s, plan in zip(segments, plans)]
        x, _ = self._layers(torch.cat([s.tokens for s in segments]),
                            torch.cat([s.positions for s in segments]), parts, False)
        logits = self.hidden_to_logits(x)
        top = TopTokens(logits)
        outs, row = [], 0
        for s in segments:
            rows = slice(row, row + s.tokens.shape[0])
            row = rows.stop
            outs.append(ForwardOutput(logits[rows], x[rows] if return_hidden else None,
                                      shared_top=top, rows=rows))
        return outs

    def _layers(self, tokens: torch.Tensor, positions: torch.Tensor,
                parts: list[tuple[KVCache, AttentionPlan]], return_queries: bool
                ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Every layer over the tokens [q] at positions [q], the rows the parts' in turn: the
        hidden states [q, hidden] and, when asked for, each layer's query of the last row."""
        cos, sin = self.rotary(positions)
        x = F.embedding(tokens, self.embed)
        if self.native is not None:
            return self.native(x, cos, sin, parts, return_queries)
        queries = [] if return_queries else None
        for i, layer in enumerate(self.layers):
            x, q = layer(x, cos, sin, i, parts, self.attention)
            if queries is not None:
                queries.append(q[-1])
        return x, queries

"""EAGLE's feature drafter (Li et al. 2024), trained as EAGLE-3 (Li et al. 2025): one decoder
layer that guesses the next tokens from the target's features.

Glossary:
- feature: the LM head's input at a position: the target's final hidden state through its
  final norm (`target_feature`); the target's next-token logits there are LM head(feature).
  Normed, it has no outlier dimensions (the raw hidden state of small models has some in the
  hundreds).
- pair (feature_{t-1}, x_t): the drafter's input at position t, fc([embed(x_t); feature_{t-1}]).
- guess g_t: the drafter's output for that pair, through its own output norm: a stand-in for
  the target's feature at t. LM head(g_t) are the drafter's logits for the token at t + 1, and
  g_t is the feature of the next pair when the drafter goes on past t (depth 2 and on).
- draft vocabulary: the drafter guesses among the training answers' most frequent tokens only:
  `vocab` maps a draft index to its token id (EAGLE-3's d2t), `draft_index` a token id back to
  its draft index. Its logits are the LM head's rows of those tokens, a product a fraction of
  the full head's size. The target still verifies over its whole vocabulary; a token outside
  the draft vocabulary is never drafted.
- training-time test (EAGLE-3): training unrolls the drafter over its own guesses (`unroll`).
  Step 1 runs the pairs of the target's true features, causally. Step k's pair at index i is
  (step k-1's guess at i, the next text token), at position i + k; it attends to step 1's
  pairs up to i (the committed text, when drafting) and to its own earlier steps at i (its
  ancestors in a draft tree): the keys a depth-k tree node sees. Later depths are trained on
  what they see when drafting, not on the target's features.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..models.build import make_linear
from ..models.compiled import int4_mm
from ..models.rope import apply_rope, rope_cos_sin, rope_frequencies
from . import store

FORMAT = 2                    # 2: post-norm features, an output norm, the draft vocabulary
INIT_STD = 0.02
PRODUCTS = ("fc", "wqkv", "wo", "w_gate_up", "w_down")
# how the drafter's products are kept for drafting where longspec::int4_mm runs: 8-bit codes
# per 32 weights (Q8_0's form), ~6x a bfloat16 product's speed for one row
# (docs/benchmarks/speculation.md)
DRAFTING_QUANT = "q8"
SLOT_BLOCK = 64               # the feature cache is read in blocks of this many slots


@dataclass(frozen=True)
class EagleShape:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    eps: float

    @classmethod
    def of(cls, config) -> EagleShape:
        """The target's own layer shape (a ModelConfig)."""
        return cls(config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                   config.intermediate_size, config.rms_norm_eps)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """Attention with each key/value head shared by its group of query heads, no key copies.

    q [..., T, heads, head_dim]; k, v [..., kv_heads, S, head_dim]; mask additive [T, S].
    Returns [..., T, heads * head_dim]."""
    *lead, t, heads, dim = q.shape
    kv_heads, s = k.shape[-3], k.shape[-2]
    group = heads // kv_heads
    qg = q.transpose(-3, -2).reshape(*lead, kv_heads, group * t, dim)
    scores = (qg @ k.transpose(-1, -2)).view(*lead, kv_heads, group, t, s) * dim ** -0.5
    probs = torch.softmax((scores + mask).float(), dim=-1).to(q.dtype)
    out = probs.view(*lead, kv_heads, group * t, s) @ v          # [..., kv_heads, g*T, dim]
    return out.view(*lead, heads, t, dim).transpose(-3, -2).reshape(*lead, t, heads * dim)


class FeatureCache:
    """The drafter's keys and values [kv_heads, capacity, head_dim], one slot per pair.

    Attention reads them in whole blocks of SLOT_BLOCK slots (the slots past the last written
    one masked out): bfloat16 products of a new shape make oneDNN build a new kernel (~1 ms
    here, more than the product), and the cache grows by a slot or two every step."""

    def __init__(self, shape: EagleShape, capacity: int, dtype: torch.dtype, device):
        self.capacity = -(-capacity // SLOT_BLOCK) * SLOT_BLOCK
        size = (shape.num_kv_heads, self.capacity, shape.head_dim)
        self.k = torch.zeros(size, dtype=dtype, device=device)
        self.v = torch.zeros(size, dtype=dtype, device=device)

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [kv_heads, q, head_dim] at slots start..; return slots [0, start + q)
        and on to the end of their block (finite values, to be masked out)."""
        end = start + k.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"feature cache overflow: {end} slots of {self.capacity}")
        self.k[:, start:end] = k
        self.v[:, start:end] = v
        read = -(-end // SLOT_BLOCK) * SLOT_BLOCK
        return self.k[:, :read], self.v[:, :read]


def unrolled_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]
                       ) -> torch.Tensor:
    """Attention of one training-time-test step: q [B, N, heads, dim]; keys, values: one
    [B, kv_heads, N, dim] per step so far, this one last. Index i attends causally to the
    first step's keys (indices <= i) and to every later step's key at i alone. Returns
    [B, N, heads * dim]."""
    b, n, heads, dim = q.shape
    kv_heads = keys[0].shape[1]
    qg = q.view(b, n, kv_heads, heads // kv_heads, dim).permute(0, 2, 3, 1, 4)  # [B,kv,g,N,d]
    scale = dim ** -0.5
    causal = (qg @ keys[0].unsqueeze(2).transpose(-1, -2)) * scale               # [B,kv,g,N,N]
    causal = causal + torch.full((n, n), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
    own = [(qg * k.unsqueeze(2)).sum(-1, keepdim=True) * scale for k in keys[1:]]
    probs = torch.softmax(torch.cat([causal, *own], dim=-1).float(), dim=-1).to(q.dtype)
    out = probs[..., :n] @ values[0].unsqueeze(2)
    for j, v in enumerate(values[1:]):
        out = out + probs[..., n + j:n + j + 1] * v.unsqueeze(2)
    return out.permute(0, 3, 1, 2, 4).reshape(b, n, heads * dim)


class EagleDrafterNet(nn.Module):
    def __init__(self, shape: EagleShape, inv_freq: torch.Tensor, rope_scale: float = 1.0,
                 draft_vocab: int = 0):
        """`inv_freq` [head_dim // 2], `rope_scale`: the target's rotary frequencies;
        `draft_vocab`: the size of the draft vocabulary (0: the target's whole vocabulary)."""
        super().__init__()
        h, s = shape.hidden_size, shape
        self.shape = shape
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.attn_norm = nn.Parameter(torch.ones(h))
        self.wqkv = nn.Linear(h, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, bias=False)
        self.wo = nn.Linear(s.num_heads * s.head_dim, h, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(h))
        self.w_gate_up = nn.Linear(h, 2 * s.intermediate_size, bias=False)
        self.w_down = nn.Linear(s.intermediate_size, h, bias=False)
        self.out_norm = nn.Parameter(torch.ones(h))
        self.inv_freq = inv_freq.float()    # kept in float32, not a buffer: .to(dtype) skips it
        self.rope_scale = rope_scale
        # token ids [draft_vocab] the drafter guesses among (an integer buffer: saved with the
        # weights, never cast to the float dtype)
        self.register_buffer("vocab", torch.arange(draft_vocab) if draft_vocab else None)
        for lin in (self.fc, self.wqkv, self.wo, self.w_gate_up, self.w_down):
            nn.init.normal_(lin.weight, std=INIT_STD)
        with torch.no_grad():       # start by passing the feature through: fc = [small | I]
            self.fc.weight[:, h:].copy_(torch.eye(h))
            self.fc.bias.zero_()

    @classmethod
    def for_model(cls, model, draft_vocab: int = 0, intermediate_size: int = 0
                  ) -> EagleDrafterNet:
        """A fresh drafter of the target's layer shape, its MLP `intermediate_size` wide when
        given (a narrower one drafts and trains faster and ships smaller)."""
        c = model.config
        inv_freq, scale = rope_frequencies(c.rope, c.head_dim)
        shape = EagleShape.of(c)
        if intermediate_size:
            shape = replace(shape, intermediate_size=intermediate_size)
        net = cls(shape, inv_freq, scale, draft_vocab)
        with torch.no_grad():       # guesses start on the scale of the target's features
            net.out_norm.copy_(model.net.norm.float())
        return net

    def set_vocab(self, token_ids: torch.Tensor) -> None:
        """Guess among these token ids [draft_vocab] only."""
        self.vocab = token_ids.to(device=self.fc.weight.device, dtype=torch.long)

    def draft_index(self, tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """The draft index of each token id in `tokens` (-1 outside the draft vocabulary)."""
        if self.vocab is None:
            return tokens.clone()
        index = torch.full((vocab_size,), -1, dtype=torch.long, device=tokens.device)
        index[self.vocab.to(tokens.device)] = torch.arange(len(self.vocab), device=tokens.device)
        return index[tokens]

    def head(self, net) -> torch.Tensor:
        """The LM head's rows the drafter's logits use [draft vocabulary, hidden] (dense)."""
        head = net.dense_head()
        return head if self.vocab is None else head[self.vocab]

    def for_drafting(self, net) -> tuple[EagleDrafterNet, nn.Module]:
        """A copy of the drafter whose products are the model's own product modules
        (models/build.py's `make_linear`), 8-bit on longspec::int4_mm where it runs, and its
        LM head as one such product: guesses as the trained drafter makes them up to the
        rounding of its weights. The drafter's arithmetic decides which tokens are proposed,
        never which are written, so it need not be the training's."""
        quantize = DRAFTING_QUANT if int4_mm() and net.device.type == "cpu" else None
        dtype, device = net.dtype, net.device
        copy = deepcopy(self)
        for name in PRODUCTS:
            lin = getattr(self, name)
            bias = None if lin.bias is None else lin.bias.detach()
            setattr(copy, name, make_linear(lin.weight.detach(), bias, dtype, device, quantize))
        return copy, make_linear(self.head(net), None, dtype, device, quantize)

    def target_feature(self, net, hidden: torch.Tensor) -> torch.Tensor:
        """The target's features (its final norm) of its final hidden states [..., hidden]."""
        return F.rms_norm(hidden, (self.shape.hidden_size,), net.norm.to(hidden.dtype),
                          self.shape.eps)

    def _inputs(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        """The residual x [..., T, hidden] and the rotated q [..., T, heads, dim], k and v
        [..., kv_heads, T, dim] of pairs (features, token embeddings) at `positions` [T]."""
        s = self.shape
        x = self.fc(torch.cat([embeds, features], dim=-1))
        h = F.rms_norm(x, (s.hidden_size,), self.attn_norm, s.eps)
        qkv = self.wqkv(h)
        nq, nkv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        cos, sin = rope_cos_sin(positions, self.inv_freq.to(x.device), self.rope_scale, x.dtype)
        lead = qkv.shape[:-1]
        q = apply_rope(qkv[..., :nq].reshape(*lead, s.num_heads, s.head_dim), cos, sin)
        k = apply_rope(qkv[..., nq:nq + nkv].reshape(*lead, s.num_kv_heads, s.head_dim), cos, sin)
        v = qkv[..., nq + nkv:].reshape(*lead, s.num_kv_heads, s.head_dim)
        return x, q, k.transpose(-3, -2), v.transpose(-3, -2)

    def _guess(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the layer after attention, and the output norm: guesses [..., T, hidden]."""
        s = self.shape
        x = x + self.wo(attended)
        h = F.rms_norm(x, (s.hidden_size,), self.mlp_norm, s.eps)
        gate, up = self.w_gate_up(h).chunk(2, dim=-1)
        x = x + self.w_down(F.silu(gate) * up)
        return F.rms_norm(x, (s.hidden_size,), self.out_norm, s.eps)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: FeatureCache, start: int, mask: torch.Tensor) -> torch.Tensor:
        """Guesses [T, hidden] for pairs (features [T, hidden], token embeddings [T, hidden])
        at `positions` [T] when drafting: their keys go to slots start.. of the cache and they
        attend to slots [0, start + T) through the additive `mask` [T, start + T]."""
        x, q, k, v = self._inputs(embeds, features, positions)
        k, v = cache.write(start, k, v)
        mask = F.pad(mask, (0, k.shape[-2] - mask.shape[1]), value=float("-inf"))
        return self._guess(x, grouped_attention(q, k, v, mask))

    def unroll(self, embeds: torch.Tensor, features: torch.Tensor, steps: int
               ) -> list[torch.Tensor]:
        """Training-time test over windows: embeds and target features [B, T, hidden] of the
        tokens x_0 .. x_{T-1}; `steps` lists of guesses [B, T - 1, hidden]. Step k's guess at
        index i is the drafter's k-th guess after x_{i+1} (of the token at i + k + 1), from the
        pair (step k-1's guess at i, x_{i+k}) at position i + k; step 1's pair is (the target's
        feature at i, x_{i+1}). Indices past the window read its last token (and are not
        trained)."""
        t = embeds.shape[1]
        index = torch.arange(t - 1, device=embeds.device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        guesses: list[torch.Tensor] = []
        inputs = features[:, :-1]
        for k in range(1, steps + 1):
            tokens_at = (index + k).clamp_max(t - 1)
            x, q, key, value = self._inputs(embeds[:, tokens_at], inputs, index + k)
            keys.append(key)
            values.append(value)
            guess = self._guess(x, unrolled_attention(q, keys, values))
            guesses.append(guess)
            inputs = guess
        return guesses

    def save(self, out_dir: str | Path, model, extra: dict | None = None) -> None:
        store.save(out_dir, "eagle", self, model,
                   {"format": FORMAT, **asdict(self.shape), **(extra or {})})


def load_eagle(path: str | Path, model) -> EagleDrafterNet:
    """The drafter in `path`, checked against `model`, on its device and dtype."""
    meta, state = store.read(path, "eagle", model)
    if meta.get("format") != FORMAT:
        raise ValueError(f"the eagle drafter in {path} has format {meta.get('format')!r}, made "
                         f"by an earlier longspec (this one reads format {FORMAT}); "
                         f"{store.train_hint('eagle')} to train it again")
    try:
        shape = EagleShape(**{k: type(v)(meta[k]) for k, v in
                              asdict(EagleShape.of(model.config)).items()})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}/eagle.json is not a valid eagle config: {e}") from None
    vocab = state.get("vocab")
    if vocab is not None and (vocab.dim() != 1 or vocab.is_floating_point()
                              or not ((vocab >= 0) & (vocab < model.config.vocab_size)).all()):
        raise ValueError(f"{path}: the draft vocabulary is not token ids of this model")
    size = 0 if vocab is None else len(vocab)
    net = EagleDrafterNet.for_model(model, size)
    if shape != net.shape:
        net = EagleDrafterNet(shape, net.inv_freq, net.rope_scale, size)
    return store.load_into(net, state, path, "eagle", model)

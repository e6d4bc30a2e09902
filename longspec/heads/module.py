"""Chained residual heads that guess the tokens after the next one from one hidden state.

h_0 is the base model's last hidden state (before the final norm); head i computes
h_i = h_{i-1} + W_i RMSNorm_i(h_{i-1}), and its logits are the base model's LM head applied to
h_i through the head's own output norm (trainable, initialised from the base model's final
norm, as in TokenSwift's reference code). Head i guesses the token i + 1 places after the one
the base predicts. Saved as safetensors plus a JSON with gamma, the hidden size, a format
version and a fingerprint of the base model.

Format 1 (the first bundled demo heads) had no output norms: its heads went through the base
model's final norm, and load with that norm copied into each head, which behaves the same.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import store
from .store import fingerprint

HEADS_WEIGHTS = "heads.safetensors"
HEADS_CONFIG = "heads.json"
GAMMA = 3
FORMAT = 2

__all__ = ["GAMMA", "HEADS_CONFIG", "HEADS_WEIGHTS", "MultiTokenHeads",
           "fingerprint", "load_heads"]


class MultiTokenHeads(nn.Module):
    def __init__(self, hidden_size: int, gamma: int = GAMMA, eps: float = 1e-6,
                 final_norm: torch.Tensor | None = None):
        """`final_norm` [hidden]: the base model's final norm weight, each head's output norm
        starts as a copy of it (ones when not given)."""
        super().__init__()
        self.hidden_size = hidden_size
        self.gamma = gamma
        self.eps = eps
        self.norms = nn.ParameterList(nn.Parameter(torch.ones(hidden_size)) for _ in range(gamma))
        # zero-initialised: every head starts out repeating the base model's own guess
        self.proj = nn.ModuleList(nn.Linear(hidden_size, hidden_size, bias=False)
                                  for _ in range(gamma))
        for p in self.proj:
            nn.init.zeros_(p.weight)
        start = torch.ones(hidden_size) if final_norm is None else final_norm.detach().float()
        self.out_norms = nn.ParameterList(nn.Parameter(start.clone()) for _ in range(gamma))

    def forward(self, h0: torch.Tensor) -> list[torch.Tensor]:
        """[..., hidden] -> gamma hidden states [..., hidden], one per head."""
        out, h = [], h0
        for norm, proj in zip(self.norms, self.proj):
            h = h + proj(F.rms_norm(h, (self.hidden_size,), norm, self.eps))
            out.append(h)
        return out

    def normed(self, h0: torch.Tensor, eps: float) -> list[torch.Tensor]:
        """Each head's hidden state [..., hidden] through its own output norm."""
        return [F.rms_norm(h, (self.hidden_size,), norm, eps)
                for h, norm in zip(self(h0), self.out_norms)]

    def logits(self, net, h0: torch.Tensor) -> torch.Tensor:
        """Logits [gamma, n, vocab] of every head for hidden states [n, hidden], through the
        heads' output norms and the base model's LM head (one product for all heads)."""
        normed = self.normed(h0, net.config.rms_norm_eps)
        return net.lm_head(torch.cat(normed)).view(self.gamma, h0.shape[0], -1)

    def save(self, out_dir: Path, model, extra: dict | None = None) -> None:
        meta = {"format": FORMAT, "gamma": self.gamma, "hidden_size": self.hidden_size,
                "eps": self.eps, **(extra or {})}
        store.save(out_dir, "heads", self, model, meta)


def load_heads(path: str | Path, model) -> MultiTokenHeads:
    """Heads from a directory written by `save`, checked against `model`, on its device/dtype."""
    meta, state = store.read(path, "heads", model)
    try:
        gamma = int(meta["gamma"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}/{HEADS_CONFIG} is not a valid heads config: {e}") from None
    heads = MultiTokenHeads(model.config.hidden_size, gamma, float(meta.get("eps", 1e-6)),
                            final_norm=model.net.norm)
    if int(meta.get("format", 1)) == 1:       # no output norms: the final norm's, as built
        state = {**state, **{k: v for k, v in heads.state_dict().items()
                             if k.startswith("out_norms.")}}
    return store.load_into(heads, state, path, "heads", model)

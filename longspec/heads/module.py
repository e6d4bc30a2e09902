"""Chained residual heads that guess the tokens after the next one from one hidden state.

h_0 is the base model's last hidden state (before the final norm); head i computes
h_i = h_{i-1} + W_i RMSNorm_i(h_{i-1}), and its logits are the base model's LM head applied to
the final norm of h_i. Head i guesses the token i + 1 places after the one the base predicts.
Saved as safetensors plus a JSON with gamma, the hidden size and a fingerprint of the base model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HEADS_WEIGHTS = "heads.safetensors"
HEADS_CONFIG = "heads.json"
GAMMA = 3


def fingerprint(model) -> str:
    """Identifies the base model by its shape and the signs of some of its weights (signs
    survive loading a checkpoint in another dtype; values would not)."""
    c = model.config
    net = model.net
    probe = torch.cat([net.embed[:4].flatten(), net.norm.flatten(),
                       net.dense_head()[-4:].flatten()])
    signs = "".join("1" if v > 0 else "0" for v in probe.float().tolist())
    text = json.dumps([c.model_type, c.vocab_size, c.hidden_size, c.num_layers, signs])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class MultiTokenHeads(nn.Module):
    def __init__(self, hidden_size: int, gamma: int = GAMMA, eps: float = 1e-6):
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

    def forward(self, h0: torch.Tensor) -> list[torch.Tensor]:
        """[n, hidden] -> gamma hidden states [n, hidden], one per head."""
        out, h = [], h0
        for norm, proj in zip(self.norms, self.proj):
            h = h + proj(F.rms_norm(h, (self.hidden_size,), norm, self.eps))
            out.append(h)
        return out

    def logits(self, net, h0: torch.Tensor) -> torch.Tensor:
        """Logits [gamma, n, vocab] of every head, through the base model's norm and LM head
        (one LM-head product for all heads)."""
        return net.hidden_to_logits(torch.cat(self(h0))).view(self.gamma, h0.shape[0], -1)

    def save(self, out_dir: Path, model, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().float().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(out_dir / HEADS_WEIGHTS))
        meta = {"gamma": self.gamma, "hidden_size": self.hidden_size, "eps": self.eps,
                "base_fingerprint": fingerprint(model), "base_model": model.name, **(extra or {})}
        (out_dir / HEADS_CONFIG).write_text(json.dumps(meta, indent=1) + "\n")


def load_heads(path: str | Path, model) -> MultiTokenHeads:
    """Heads from a directory written by `save`, checked against `model`, on its device/dtype."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    cfg_path, weights = path / HEADS_CONFIG, path / HEADS_WEIGHTS
    if not cfg_path.is_file() or not weights.is_file():
        raise ValueError(f"{path} holds no heads ({HEADS_CONFIG} and {HEADS_WEIGHTS}); "
                         "train them with 'longspec train-heads'")
    try:
        meta = json.loads(cfg_path.read_text())
        gamma, hidden = int(meta["gamma"]), int(meta["hidden_size"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{cfg_path} is not a valid heads config: {e}") from None
    if hidden != model.config.hidden_size or meta.get("base_fingerprint") != fingerprint(model):
        raise ValueError(f"the heads in {path} were trained for another model "
                         f"({meta.get('base_model')!r}); train heads for this one with "
                         "'longspec train-heads'")
    heads = MultiTokenHeads(hidden, gamma, float(meta.get("eps", 1e-6)))
    try:
        heads.load_state_dict(load_file(str(weights)))
    except (SafetensorError, RuntimeError, OSError) as e:
        raise ValueError(f"cannot load {weights}: {e}") from None
    heads.requires_grad_(False)
    return heads.to(device=model.device, dtype=model.dtype).eval()


def find_bundled_heads(model) -> Path | None:
    """The heads shipped with the bundled demo model, when `model` is it."""
    from ..models.loader import demo_path

    demo = demo_path("demo")
    if Path(model.path).resolve() != demo.resolve():
        return None
    bundled = demo.parent / "heads"
    return bundled if (bundled / HEADS_CONFIG).is_file() else None

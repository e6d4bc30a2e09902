"""Train multi-token heads on a frozen base model.

Head i, fed the hidden state at position t, learns the token at t + 1 + i: from the text itself
(`target="text"`, cross-entropy), or from the base model's own next-token distribution at
t + i (`target="distill"`, self-distillation, which teaches the heads what the model would
write rather than what the text says). AdamW with linear warmup and cosine decay; TokenSwift
used lr 5e-3, 200 steps, weight decay 0.1.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..cache import StaticCache, causal_mask
from ..text import read_text_file
from ..training import warmup_cosine
from .module import GAMMA, MultiTokenHeads

TARGETS = ("text", "distill")


@dataclass(frozen=True)
class HeadsTraining:
    steps: int = 200
    lr: float = 5e-3
    warmup_steps: int = 20
    weight_decay: float = 0.1
    batch_size: int = 8
    seq_len: int = 512
    target: str = "text"          # "text" or "distill"
    gamma: int = GAMMA
    seed: int = 0
    held_out: float = 0.05        # share of the token stream kept for evaluation

    def validate(self) -> HeadsTraining:
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        for name in ("steps", "batch_size", "gamma"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.seq_len < self.gamma + 2:
            raise ValueError(f"seq_len must be at least gamma + 2 = {self.gamma + 2}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        return self


def read_token_stream(model, files: list[str | Path]) -> torch.Tensor:
    if model.tokenizer is None:
        raise ValueError(f"{model.path} has no tokenizer; heads are trained on text")
    if not files:
        raise ValueError("give at least one --data file")
    ids: list[int] = []
    for f in files:
        ids.extend(model.tokenizer(read_text_file(f, "data file"))["input_ids"])
    return torch.tensor(ids, dtype=torch.long)


def base_outputs(model, batch: torch.Tensor,
                 want_logits: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Hidden states [B, T, hidden] (fp32) and, optionally, logits [B, T, vocab] of the frozen
    base."""
    net = model.net
    hidden, logits = [], []
    seq_len = batch.shape[1]
    mask = causal_mask(seq_len, net.dtype, net.device)
    positions = torch.arange(seq_len, device=net.device)
    for seq in batch:
        cache = StaticCache(model.config, seq_len, net.dtype, net.device)
        out = net(seq.to(net.device), positions, cache, mask, return_hidden=True,
                  need_logits=want_logits)
        hidden.append(out.hidden.float())
        if want_logits:
            logits.append(out.logits.float())
    return torch.stack(hidden), (torch.stack(logits) if want_logits else None)


def heads_loss(heads: MultiTokenHeads, model, batch: torch.Tensor, target: str) -> torch.Tensor:
    """Sum over heads of the cross-entropy for the token at t + 1 + i (or against the base's
    distribution at t + i when distilling)."""
    hidden, base_logits = base_outputs(model, batch, target == "distill")
    net = model.net
    labels = batch.to(hidden.device)
    total = hidden.new_zeros(())
    for i, h in enumerate(heads(hidden), start=1):
        span = batch.shape[1] - 1 - i                   # positions t with a token at t + 1 + i
        logits = F.linear(F.rms_norm(h[:, :span], (h.shape[-1],), net.norm.float(),
                                     model.config.rms_norm_eps), net.dense_head().float())
        flat = logits.reshape(-1, logits.shape[-1])
        if target == "distill":
            soft = torch.softmax(base_logits[:, i:i + span], dim=-1).reshape(flat.shape)
            total = total - (soft * torch.log_softmax(flat, dim=-1)).sum(-1).mean()
        else:
            total = total + F.cross_entropy(flat, labels[:, 1 + i:1 + i + span].reshape(-1))
    return total


def _batch(stream: torch.Tensor, cfg: HeadsTraining, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - cfg.seq_len, (cfg.batch_size,), generator=gen)
    return torch.stack([stream[s:s + cfg.seq_len] for s in starts.tolist()])


@torch.no_grad()
def evaluate(heads, model, stream: torch.Tensor, cfg: HeadsTraining, batches: int = 4) -> float:
    """Mean held-out loss on fixed batches."""
    gen = torch.Generator().manual_seed(12345)
    return sum(heads_loss(heads, model, _batch(stream, cfg, gen), cfg.target).item()
               for _ in range(batches)) / batches


def train_heads(model, files: list[str | Path], cfg: HeadsTraining, out: str | Path | None = None,
                progress: bool = True) -> dict:
    """Train heads for `model` on the text of `files`; save them to `out` when given.
    Returns a record with the loss curve and the held-out loss before and after."""
    cfg = cfg.validate()
    stream = read_token_stream(model, files)
    split = int(len(stream) * (1 - cfg.held_out))
    train, held = stream[:split], stream[split:]
    if len(train) <= cfg.seq_len or len(held) <= cfg.seq_len:
        raise ValueError(f"the data has {len(stream)} tokens; need more than "
                         f"{int(cfg.seq_len / cfg.held_out)} for seq_len {cfg.seq_len}")
    torch.manual_seed(cfg.seed)
    heads = MultiTokenHeads(model.config.hidden_size, cfg.gamma,
                            model.config.rms_norm_eps).to(model.device)
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    before = evaluate(heads, model, held, cfg)
    curve = []
    start = time.time()
    bar = tqdm(range(cfg.steps), desc="train heads", disable=not progress, dynamic_ncols=True)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = warmup_cosine(step, cfg.steps, cfg.warmup_steps, cfg.lr)
        loss = heads_loss(heads, model, _batch(train, cfg, gen), cfg.target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(heads.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        curve.append(round(loss.item(), 4))
    after = evaluate(heads, model, held, cfg)
    record = {"training": asdict(cfg), "held_out_loss_before": round(before, 4),
              "held_out_loss_after": round(after, 4), "seconds": round(time.time() - start, 1),
              "train_tokens": len(train), "loss_curve": curve,
              "data": [Path(f).name for f in files]}
    if out is not None:
        heads.save(Path(out), model, record)
    return record

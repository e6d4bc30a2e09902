"""What each kind of drafter learns from a window of text and the frozen target's outputs.

- heads: head i, fed the feature at t, learns the token at t + 1 + i: the text's (`text`) or
  the target's own distribution at t + i (`distill`). Loss: the sum over heads.
- eagle (training-time test, as EAGLE-3): the drafter unrolled `ttt_steps` steps over its own
  guesses (`EagleDrafterNet.unroll`); step k's guess at index i learns the token at i + k + 1:
  the target's distribution at i + k over the draft vocabulary (`distill`, soft labels) or
  the text's token (`text`). Only answer tokens are learned (all tokens of plain text). Loss:
  the mean over steps of their cross-entropies.

Both report agreement per depth: heads, when the batch carries the target's full logits, the
share of positions where the head's top guess is the target's own greedy choice; eagle, the
acceptance of its greedy drafts per depth (`acceptance`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..heads.eagle import EagleDrafterNet
from ..heads.module import MultiTokenHeads
from ..sampling.logits import SamplingConfig, process_logits
from ..sampling.noise import gumbel_rows, noise_key
from .data import TargetBatch, TokenStream


def build(kind: str, model, cfg, stream: TokenStream) -> torch.nn.Module:
    """A fresh drafter of `kind` for `model` (float32, on its device); an EAGLE drafter's
    draft vocabulary is the cfg.draft_vocab most frequent answer tokens of the training
    `stream`."""
    c = model.config
    if kind == "heads":
        module = MultiTokenHeads(c.hidden_size, cfg.gamma, c.rms_norm_eps,
                                 final_norm=model.net.norm)
    else:
        size = cfg.draft_vocab if 0 < cfg.draft_vocab < c.vocab_size else 0
        module = EagleDrafterNet.for_model(model, size, cfg.eagle_mlp)
        if size:
            module.set_vocab(frequent_tokens(stream.ids[stream.answer], size, c.vocab_size))
    return module.to(model.device)


def frequent_tokens(stream: torch.Tensor, n: int, vocab_size: int) -> torch.Tensor:
    """The n most frequent token ids of `stream` (ties to the lower id), in increasing order."""
    counts = torch.bincount(stream, minlength=vocab_size).double()
    order = torch.argsort(-counts + torch.arange(vocab_size) / (2.0 * vocab_size))
    return order[:n].sort().values


def _soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of -sum p_target log q: logits, target_logits [..., vocab]."""
    flat = logits.reshape(-1, logits.shape[-1])
    soft = torch.softmax(target_logits.reshape(flat.shape), dim=-1)
    return -(soft * torch.log_softmax(flat, dim=-1)).sum(-1).mean()


def _agreement(logits: torch.Tensor, target_logits: torch.Tensor | None) -> float | None:
    if target_logits is None:
        return None
    return (logits.argmax(-1) == target_logits.argmax(-1)).float().mean().item()


def heads_loss(heads: MultiTokenHeads, model, batch: TargetBatch, cfg
               ) -> tuple[torch.Tensor, list[float | None]]:
    """The sum over heads of their cross-entropies, and each head's agreement."""
    total = batch.hidden.new_zeros(())
    agreement = []
    seq_len = batch.tokens.shape[1]
    for i, h in enumerate(heads.normed(batch.hidden, model.config.rms_norm_eps), start=1):
        span = seq_len - 1 - i                  # positions t with a token at t + 1 + i
        logits = F.linear(h[:, :span], model.net.dense_head().float())
        wanted = None if batch.logits is None else batch.logits[:, i:i + span]
        if cfg.target == "distill":
            total = total + _soft_cross_entropy(logits, wanted)
        else:
            labels = batch.tokens[:, 1 + i:1 + i + span]
            total = total + F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                            labels.reshape(-1))
        agreement.append(_agreement(logits, wanted))
    return total, agreement


def eagle_loss(eagle: EagleDrafterNet, model, batch: TargetBatch, cfg
               ) -> tuple[torch.Tensor, list[float | None]]:
    """The mean over the unrolled steps of their losses (`eagle_losses`), and the greedy
    acceptance per depth (`acceptance`) when the batch carries the target's logits."""
    losses, logits_per_step = eagle_losses(eagle, model, batch, cfg)
    rates = [None] * len(losses)
    if batch.logits is not None:
        with torch.no_grad():
            rates = [r["rate"] for r in acceptance(eagle, batch, logits_per_step)]
    return sum(losses) / len(losses), rates


def eagle_losses(eagle: EagleDrafterNet, model, batch: TargetBatch, cfg
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per unrolled step (cfg.ttt_steps), its token cross-entropy over answer tokens and its
    logits [B, T - k - 1, draft vocab]."""
    net = model.net
    seq_len = batch.tokens.shape[1]
    features = eagle.target_feature(net, batch.hidden)                # [B, T, hidden]
    embeds = F.embedding(batch.tokens, net.embed).float()
    head = eagle.head(net).float()                                      # [draft vocab, hidden]
    losses, logits_per_step = [], []
    for k, guess in enumerate(eagle.unroll(embeds, features, cfg.ttt_steps), start=1):
        span = seq_len - k - 1                  # indices i with a token at i + k + 1
        logits = F.linear(guess[:, :span], head)
        logits_per_step.append(logits)
        learn = batch.answer[:, k + 1:k + 1 + span].float()
        if cfg.target == "distill":
            with torch.no_grad():
                wanted = torch.softmax(F.linear(features[:, k:k + span], head), dim=-1)
            loss = -(wanted * torch.log_softmax(logits, dim=-1)).sum(-1)
        else:
            labels = eagle.draft_index(batch.tokens[:, k + 1:k + 1 + span],
                                       model.config.vocab_size)
            learn = learn * (labels >= 0)       # text tokens outside the draft vocabulary
            loss = F.cross_entropy(logits.transpose(1, 2), labels.clamp_min(0), reduction="none")
        losses.append((loss * learn).sum() / learn.sum().clamp_min(1))
    return losses, logits_per_step


def acceptance(eagle: EagleDrafterNet, batch: TargetBatch, logits_per_step: list[torch.Tensor],
               top: int = 1, sampling: SamplingConfig | None = None, seed: int = 0
               ) -> list[dict]:
    """Per depth k, how often the drafter's guess is the token the target takes there, among
    answer positions where its guesses at depths 1 .. k-1 were taken too (depth k given k-1
    accepted), from the unrolled steps' logits [B, T - k - 1, draft vocab] and the batch's
    target logits. The target takes its greedy choice, or with `sampling` its Gumbel-max
    choice under the generations' position-keyed noise (keyed by `seed`), which the drafter's
    guess sees too, as when drafting; with `top` > 1 a depth counts as accepted when the
    target's token is among the drafter's `top` guesses (a tree that wide). Returns
    [{"accepted", "tried", "rate"}] per depth."""
    seq_len = batch.tokens.shape[1]
    target_logits = batch.logits
    vocab = (eagle.vocab if eagle.vocab is not None
             else torch.arange(target_logits.shape[-1], device=target_logits.device))
    noise = None
    if sampling is not None:
        target_logits = process_logits(target_logits.flatten(0, 1), sampling).view_as(
            target_logits)
        b, t, v = target_logits.shape       # each window's positions keyed apart
        positions = torch.arange(b * t, device=target_logits.device)
        noise = gumbel_rows(noise_key(seed, []), positions, v).view(b, t, v)
        target_logits = target_logits + noise
    chosen = target_logits.argmax(-1)                                   # [B, T]
    steps = len(logits_per_step)
    span = seq_len - 1 - steps                  # indices every step covers
    alive = batch.answer[:, 2:2 + span]
    rates = []
    for k, logits in enumerate(logits_per_step, start=1):
        scores = logits[:, :span].float()
        if sampling is not None:
            scores = process_logits(scores.flatten(0, 1), sampling).view_as(scores)
            scores = scores + noise[:, k:k + span][..., vocab]
        guesses = vocab[scores.topk(top, dim=-1).indices]               # [B, span, top]
        taken = chosen[:, k:k + span]
        hit = (guesses == taken.unsqueeze(-1)).any(-1)
        tried, accepted = alive.sum().item(), (alive & hit).sum().item()
        rates.append({"accepted": accepted, "tried": tried,
                      "rate": round(accepted / tried, 4) if tried else 0.0})
        if k < steps:   # depth k + 1 goes on where this one was taken and the text went there
            alive = (alive & hit & (batch.tokens[:, k + 1:k + 1 + span] == taken)
                     & batch.answer[:, k + 2:k + 2 + span])
    return rates


def implied_length(rates: list[float]) -> float:
    """The mean tokens a step commits when depth k is accepted with rate rates[k-1] given
    k-1 accepted: 1 (the target's own token) + sum over k of the product of rates up to k."""
    total, chain = 1.0, 1.0
    for r in rates:
        chain *= r
        total += chain
    return round(total, 3)


LOSSES = {"heads": heads_loss, "eagle": eagle_loss}

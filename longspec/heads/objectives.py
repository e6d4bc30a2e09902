"""What each kind of drafter learns from a window of text and the frozen target's outputs.

- heads: head i, fed the feature at t, learns the token at t + 1 + i: the text's (`text`) or
  the target's own distribution at t + i (`distill`). Loss: the sum over heads.
- eagle: the pair (f_t, x_{t+1}) at position t + 1 learns the feature f_{t+1} (smooth L1,
  as EAGLE, in units of the batch's feature RMS) and, through the target's final norm and LM
  head, the token at t + 2: the target's distribution at t + 1 (`distill`) or the text's
  token (`text`). Loss: feature_weight * smooth L1 + token_weight * cross-entropy. With a draft
  vocabulary both distributions are over its tokens (the target's restricted to them, as
  EAGLE-3 trains), so the head's product stays small in training too.

Both report agreement, when the batch carries the target's full logits: the share of
positions where the drafter's top guess is the target's own greedy choice there, per depth
(heads: one per head; eagle: depth 1, from true features).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .data import TargetBatch
from .eagle import EagleDrafterNet
from .module import MultiTokenHeads


def build(kind: str, model, cfg, stream: torch.Tensor) -> torch.nn.Module:
    """A fresh drafter of `kind` for `model` (float32, on its device); an EAGLE drafter's
    draft vocabulary is the cfg.draft_vocab most frequent tokens of the training `stream`."""
    c = model.config
    if kind == "heads":
        module = MultiTokenHeads(c.hidden_size, cfg.gamma, c.rms_norm_eps,
                                 final_norm=model.net.norm)
    else:
        size = cfg.draft_vocab if 0 < cfg.draft_vocab < c.vocab_size else 0
        module = EagleDrafterNet.for_model(model, size)
        if size:
            module.set_vocab(frequent_tokens(stream, size, c.vocab_size))
    return module.to(model.device)


def frequent_tokens(stream: torch.Tensor, n: int, vocab_size: int) -> torch.Tensor:
    """The n most frequent token ids of `stream` (ties to the lower id), in increasing order."""
    counts = torch.bincount(stream, minlength=vocab_size).double()
    order = torch.argsort(-counts + torch.arange(vocab_size) / (2.0 * vocab_size))
    return order[:n].sort().values


def _lm_head(model, h: torch.Tensor, norm: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Logits [..., rows] of hidden states through an RMSNorm weight and LM head rows
    (float32, so that gradients reach the drafter through the frozen head)."""
    h = F.rms_norm(h, (h.shape[-1],), norm.float(), model.config.rms_norm_eps)
    return F.linear(h, head)


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
    """feature_weight * smooth L1 of the predicted features + token_weight * cross-entropy of
    their logits, and the depth-1 agreement."""
    net = model.net
    seq_len = batch.tokens.shape[1]
    embeds = F.embedding(batch.tokens[:, 1:], net.embed).float()        # x_1 .. x_{T-1}
    positions = torch.arange(1, seq_len, device=batch.hidden.device)
    predicted = eagle(embeds, batch.hidden[:, :-1], positions)          # f^_1 .. f^_{T-1}
    # in units of the features' RMS: the loss weights then mean the same for every model (raw
    # features of small models run to hundreds)
    scale = batch.hidden.pow(2).mean().sqrt().clamp_min(1e-6)
    feature_loss = F.smooth_l1_loss(predicted / scale, batch.hidden[:, 1:] / scale)
    head = eagle.head(net).float()                                      # [draft vocab, hidden]
    logits = _lm_head(model, predicted, net.norm, head)                 # guesses x_2 .. x_T
    if cfg.target == "distill":
        with torch.no_grad():
            wanted = _lm_head(model, batch.hidden[:, 1:], net.norm, head)
        token_loss = _soft_cross_entropy(logits, wanted)
    else:
        labels = batch.tokens[:, 2:]
        if eagle.vocab is not None:     # text tokens outside the draft vocabulary count not
            index = torch.full((model.config.vocab_size,), -100, device=labels.device)
            index[eagle.vocab] = torch.arange(len(eagle.vocab), device=labels.device)
            labels = index[labels]
        token_loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                     labels.reshape(-1), ignore_index=-100)
    loss = cfg.feature_weight * feature_loss + cfg.token_weight * token_loss
    agreement = None
    if batch.logits is not None:
        guess = logits.argmax(-1) if eagle.vocab is None else eagle.vocab[logits.argmax(-1)]
        agreement = (guess == batch.logits[:, 1:].argmax(-1)).float().mean().item()
    return loss, [agreement]


LOSSES = {"heads": heads_loss, "eagle": eagle_loss}

"""Sampling: one logits-processing function and position-keyed Gumbel-max selection.

Processing order, used by plain decoding, by drafters and by verification alike:
grammar mask -> logit bias -> contextual penalty -> frequency and presence penalties ->
temperature -> top-k -> top-p -> min-p -> eta.

The sample for absolute position t is argmax(processed logits + g_t), where the Gumbel noise
g_t depends on (seed, prompt, t) only (sampling/noise.py). Plain decoding and tree verification
therefore pick the same token at every position, which makes "lossless" checkable token by
token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
import torch


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0    # 0 means greedy
    top_p: float = 1.0          # nucleus mass kept, in (0, 1]
    top_k: int = 0              # keep the k most likely tokens; 0 = off
    min_p: float = 0.0          # drop tokens below min_p * p(most likely); in [0, 1)
    eta: float = 0.0            # eta sampling threshold (Hewitt et al.); 0 = off
    penalty: float = 1.0        # contextual penalty theta on tokens in the window; 1 = off
    penalty_window: int = 1024  # tokens the contextual penalty looks back over
    # OpenAI's penalties over the tokens generated so far: a token's logit less
    # frequency_penalty times its count and presence_penalty once it occurs; in [-2, 2]
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_penalty(self) -> bool:
        return self.penalty != 1.0

    @property
    def counts_output(self) -> bool:
        """Whether the output's token counts matter (frequency or presence penalty)."""
        return self.frequency_penalty != 0 or self.presence_penalty != 0

    def validate(self) -> SamplingConfig:
        """Raise ValueError naming the first setting out of range; return self."""
        for f in fields(self):
            value = getattr(self, f.name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)):
                raise ValueError(f"sampling {f.name} must be a finite number, got {value!r}")
        checks = [
            ("temperature", self.temperature >= 0, ">= 0 (0 is greedy)"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0 and float(self.top_k).is_integer(), "a whole number >= 0"),
            ("min_p", 0 <= self.min_p < 1, "in [0, 1)"),
            ("eta", 0 <= self.eta < 1, "in [0, 1)"),
            ("penalty", self.penalty > 0, "> 0 (1 is off)"),
            ("penalty_window", self.penalty_window >= 1 and float(self.penalty_window).is_integer(),
             "a whole number >= 1"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "in [-2, 2]"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "in [-2, 2]"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"sampling {name} must be {rule}, got {getattr(self, name)!r}")
        return self


def apply_penalty(logits: torch.Tensor, present: torch.Tensor, theta: float) -> torch.Tensor:
    """Contextual (repetition) penalty: logits of tokens present in the window are divided by
    theta when positive and multiplied by it when negative."""
    penalized = torch.where(logits > 0, logits / theta, logits * theta)
    return torch.where(present, penalized, logits)


def process_logits(logits: torch.Tensor, cfg: SamplingConfig,
                   present: torch.Tensor | None = None,
                   allowed: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                   counts: torch.Tensor | None = None) -> torch.Tensor:
    """The one logits-processing function. logits [n, vocab] -> processed fp32 logits, with
    removed tokens at -inf. `present` [n, vocab] marks tokens in each row's penalty window,
    `allowed` [n, vocab] the tokens a grammar allows after each row (outputs/grammar.py), `bias`
    [vocab] or [n, vocab] is added (OpenAI's logit_bias), `counts` [n, vocab] counts each
    token in the output before each row (frequency and presence penalties)."""
    x = logits.float()
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    if bias is not None:
        x = x + bias
    if present is not None and cfg.uses_penalty:
        x = apply_penalty(x, present, cfg.penalty)
    if counts is not None and cfg.counts_output:
        x = x - (cfg.frequency_penalty * counts + cfg.presence_penalty * (counts > 0))
    if cfg.greedy:
        return x
    if cfg.temperature != 1.0:
        x = x / cfg.temperature
    neg_inf = float("-inf")
    if 0 < cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, int(cfg.top_k), dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, neg_inf)
    if cfg.top_p < 1.0:
        x = _nucleus(x, cfg.top_p)
    if cfg.min_p > 0:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < cfg.min_p * probs.amax(dim=-1, keepdim=True), neg_inf)
    if cfg.eta > 0:
        probs = torch.softmax(x, dim=-1)
        entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1, keepdim=True)
        threshold = torch.minimum(torch.full_like(entropy, cfg.eta),
                                  math.sqrt(cfg.eta) * torch.exp(-entropy))
        remove = probs < threshold
        remove.scatter_(-1, probs.argmax(dim=-1, keepdim=True), False)
        x = x.masked_fill(remove, neg_inf)
    return x


# OpenAI's floor for a log probability that is -inf (a token the processing removed): JSON has no
# infinity
LOGPROB_FLOOR = -9999.0


def token_logprobs(processed: torch.Tensor, rows: list[int], tokens: list[int], top: int
                   ) -> list[dict]:
    """Each committed token's log probability under its row of processed logits (the
    distribution it was chosen from, temperature and filters applied; greedy: the logits after
    the mask and the penalty), and the `top` likeliest tokens' (OpenAI's logprobs and
    top_logprobs): [{"token", "logprob", "top": [[token, logprob], ...]}]."""
    index = torch.tensor(rows, device=processed.device)
    logprobs = torch.log_softmax(processed[index], dim=-1).clamp_min(LOGPROB_FLOOR)
    chosen = logprobs.gather(1, torch.tensor(tokens, device=processed.device)[:, None])[:, 0]
    values, ids = logprobs.topk(top, dim=-1) if top else (chosen[:, None][:, :0],) * 2
    chosen, values, ids = chosen.tolist(), values.tolist(), ids.tolist()
    return [{"token": t, "logprob": lp, "top": [list(pair) for pair in zip(i, v)]}
            for t, lp, i, v in zip(tokens, chosen, ids, values)]


# On a CPU, torch's full sort of the vocabulary costs ~0.6 ms a row; the nucleus usually lies
# among the few dozen tokens of at least this probability (SmolLM2's sampled chat rows: a median
# of 33, at most 353), which numpy lists in ~20 us (torch's topk of 64: ~70 us), and a row built
# from its kept tokens alone saves a mask over the vocabulary (~50 us); numpy sorts values ~5x
# faster than torch.
NUCLEUS_FLOOR = 1e-4


def _nucleus_threshold(ordered: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest kept probability [n, 1] of rows sorted in descending order [n, k] (a token
    is kept when the mass before it is below top_p), and whether every one of the k was kept
    (the nucleus may then reach past them). torch's cumsum sums in order, so a row's first k
    sorted values give the sums a whole sorted row starts with."""
    kept = ((torch.cumsum(ordered, dim=-1) - ordered) < top_p).sum(-1, keepdim=True)
    return ordered.gather(-1, kept - 1), kept[:, 0] == ordered.shape[-1]


def _sorted_descending(probs: torch.Tensor) -> torch.Tensor:
    if probs.device.type == "cpu":
        return torch.from_numpy(np.ascontiguousarray(np.sort(probs.numpy(), axis=-1)[:, ::-1]))
    return torch.sort(probs, dim=-1, descending=True).values


def _nucleus(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """x with the tokens outside the nucleus at -inf: a token stays when its probability is at
    least that of the last token whose mass before it is below top_p, so tokens tied on the
    boundary all stay. Each row's answer depends on that row alone: on a CPU it comes from the
    row's tokens of at least NUCLEUS_FLOOR probability (sorted, the start of the whole row
    sorted) when the nucleus ends among them, else from a full sort."""
    probs = torch.softmax(x, dim=-1)
    if x.device.type != "cpu":
        return x.masked_fill(probs < _nucleus_threshold(_sorted_descending(probs), top_p)[0],
                             float("-inf"))
    out = torch.full_like(x, float("-inf"))
    for row, (p, logits) in enumerate(zip(probs.numpy(), x)):
        tokens = np.flatnonzero(p >= NUCLEUS_FLOOR)
        ordered = torch.from_numpy(np.sort(p[tokens])[::-1].copy())[None]
        threshold, beyond = _nucleus_threshold(ordered, top_p) if len(tokens) else (None, True)
        if bool(beyond):
            whole = probs[row:row + 1]
            threshold = _nucleus_threshold(_sorted_descending(whole), top_p)[0]
            out[row] = logits.masked_fill(whole[0] < threshold[0], float("-inf"))
        else:
            kept = torch.from_numpy(tokens[p[tokens] >= threshold.item()])
            out[row, kept] = logits[kept]
    return out

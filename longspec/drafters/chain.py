"""A model with a cache of its own that follows the committed sequence and drafts chains.

`fed` counts the tokens of the sequence whose keys and values the cache holds, always the
latest slots, so rewinding to fewer tokens is moving the cache's length back.

A draft model may draft over part of its vocabulary (`vocab`): its LM head then computes the
logits of the first `vocab` tokens and of every block of 16 token ids that holds a token of
the sequence so far (the prompt's and the text's own words), the others -inf. Byte-level BPE
vocabularies (Qwen2.5's, Llama 3's, SmolLM2's) list tokens in merge order, the frequent ones
first: Qwen2.5's first 32,768 of 151,936 tokens make 88-96% of the tokens of its chat answers,
for a fifth of the LM head's work, which is a third of a 0.5B model's step
(docs/benchmarks/speculation.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..cache import StaticCache
from ..models.linear import HeadPart
from ..models.prefill import prefill
from ..models.transformer import Transformer
from ..state.prompt_cache import PromptCache


class ChainModel:
    def __init__(self, net: Transformer, cache: StaticCache, slot_positions: bool = False,
                 vocab: int = 0):
        """`vocab`: draft over the first `vocab` tokens (rounded down to a multiple of 16) and
        those of the sequence's blocks of 16 tokens, where the head's layout allows (0: the
        whole vocabulary)."""
        self.net = net
        self.cache = cache
        self.fed = 0
        # a token's position: its index in the sequence, or its slot in the cache (StreamingLLM)
        self.slot_positions = slot_positions
        self.head = (HeadPart.over(net.lm_head, vocab)
                     if 0 < vocab < net.config.vocab_size else None)

    def feed(self, tokens: list[int], last_logits: int = 1) -> torch.Tensor | None:
        """Run `tokens` (the next ones of the sequence) into the cache; return the logits
        [last_logits, vocab] after the last ones (None when last_logits is 0)."""
        first = self.cache.length if self.slot_positions else self.fed
        if self.head is not None:
            self.head.add(tokens)
        logits = prefill(self.net, tokens, self.cache, first, last_logits=last_logits,
                         head=self.head)
        self.fed += len(tokens)
        return logits

    def restore(self, sequence: list[int], prompt_cache: PromptCache) -> None:
        """Before anything is fed: take the longest prefix of `sequence` the model's prompt
        cache holds (state/prompt_cache.py), as feeding it would."""
        self.fed = prompt_cache.restore(sequence, self.cache)
        if self.head is not None:
            self.head.add(sequence[:self.fed])

    def catch_up(self, sequence: list[int], last_logits: int = 1) -> torch.Tensor | None:
        """Feed the tokens of `sequence` the cache has not seen (at least the last one when
        logits are wanted, re-running it if the cache already holds it)."""
        if last_logits and self.fed >= len(sequence):
            self.rewind(len(sequence) - 1)
        return self.feed(sequence[self.fed:], last_logits)

    def rewind(self, fed: int) -> None:
        """Forget the latest tokens, keeping the first `fed` of the sequence."""
        self.cache.rollback(self.cache.length - (self.fed - fed))
        self.fed = fed

    def draft(self, sequence: list[int], gamma: int,
              choose: Callable[[torch.Tensor, list[int]], tuple[torch.Tensor, int]],
              ahead: int = 0,
              go_on: Callable[[list[torch.Tensor], list[int]], bool] | None = None
              ) -> tuple[list[int], list[torch.Tensor]]:
        """Draft up to `gamma` tokens after `sequence`, each chosen by `choose(logits, path)`
        where path holds the last `ahead` tokens of sequence (not committed) plus the drafts so
        far, and after each one only while `go_on(rows, drafts)` says so (when given). Returns
        the drafts and their processed logits; the cache keeps all but the last draft."""
        logits = self.catch_up(sequence)
        path = list(sequence[len(sequence) - ahead:]) if ahead else []
        drafts, rows = [], []
        for i in range(gamma):
            processed, token = choose(logits, path)
            drafts.append(token)
            rows.append(processed)
            path.append(token)
            if i + 1 == gamma or (go_on is not None and not go_on(rows, drafts)):
                break
            logits = self.feed([token])
        return drafts, rows


def root_queries(net: Transformer, committed: list[int], full: StaticCache) -> list[torch.Tensor]:
    """Each layer's rotated query [heads, d] of the root (committed[-1]) over the full cache.
    The root's keys land in the full cache's next slot, which the verify pass overwrites."""
    device = net.device
    out = net(torch.tensor(committed[-1:], device=device),
              torch.tensor([len(committed) - 1], device=device), full,
              need_logits=False, return_queries=True)
    return out.queries

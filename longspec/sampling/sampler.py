"""The sampling state of one generation: settings, position-keyed noise and the penalty window.

Plain decoding, tree verification and draft models all choose tokens through this object, so
the same position gets the same choice rule everywhere. Positions are counted from the
committed sequence; `ahead` names tokens a draft level has accepted beyond it but that are not
committed yet (the hierarchical drafter verifies in two stages).

A grammar (outputs/grammar.py) masks every choice: each tree node's by the grammar state at the
end of its path, a draft's by the state after its chain.

In rejection mode (`verify="rejection"`), draft tokens are sampled from their own distribution
with a seeded generator, and acceptance and residual draws use the same generator.
"""

from __future__ import annotations

import torch

from ..device.memory import upload
from ..outputs.grammar import GrammarState
from ..step.tree import DraftTree
from .logits import SamplingConfig, process_logits
from .noise import PositionNoise, gumbel_keyed
from .penalty import PenaltyWindow

WHOLE_OUTPUT = 2**62    # a window that holds every token (the output's counts)


class Sampler:
    def __init__(self, config: SamplingConfig, seed: int, prompt_ids: list[int], vocab_size: int,
                 device: torch.device, *, rejection: bool = False,
                 grammar: GrammarState | None = None, bias: torch.Tensor | None = None,
                 least: tuple[int, list[int]] = (0, [])):
        """`grammar`: the state of the grammar the new tokens must follow, or None; `bias`
        [vocab]: added to every row's logits (OpenAI's logit_bias), or None; `least`: the new
        tokens before which the ending ids (EOS, stop tokens) are never chosen, and those ids
        (min_new_tokens)."""
        self.config = config
        self.seed = seed
        self.device = device
        self.rejection = rejection and not config.greedy
        self.noise = (None if config.greedy
                      else PositionNoise(seed, prompt_ids, vocab_size, device))
        self.penalty = (PenaltyWindow(int(config.penalty_window), vocab_size, device)
                        if config.uses_penalty else None)
        self.rng = torch.Generator(device=device)
        self.rng.manual_seed(seed)
        self.length = 0   # committed tokens, prompt included
        self.prompt_length = len(prompt_ids)
        self.grammar = grammar
        self.bias = bias
        # the output's tokens (the prompt's not), counted for frequency and presence penalties
        self.output = (PenaltyWindow(WHOLE_OUTPUT, vocab_size, device)
                       if config.counts_output else None)
        self.least = least[0] if least[1] else 0
        self.ending: torch.Tensor | None = None     # [vocab]: the ending ids, while they matter
        if self.least:
            self.ending = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.ending[least[1]] = True

    def _early(self, allowed: torch.Tensor | None, new_before: torch.Tensor
               ) -> torch.Tensor | None:
        """`allowed` [n, vocab] (None: every token) less the ending ids in the rows whose
        choice would be a new token before the min_new_tokens-th (`new_before` [n]: the new
        tokens ahead of each row's choice)."""
        if self.least == 0 or int(new_before.min()) + 1 > self.least:
            return allowed
        early = (new_before + 1 <= self.least)[:, None] & self.ending
        return ~early if allowed is None else allowed & ~early

    def commit(self, tokens: list[int]) -> None:
        output = tokens[max(0, self.prompt_length - self.length):]
        if self.grammar is not None:
            self.grammar.commit(output)
        if self.output is not None:
            self.output.extend(output)
        self.length += len(tokens)
        if self.penalty is not None:
            self.penalty.extend(tokens)
        if self.noise is not None:
            self.noise.forget_before(self.length)

    @staticmethod
    def _ahead(window: PenaltyWindow | None, ahead: list[int]) -> PenaltyWindow | None:
        """The window as it is once `ahead` is committed too."""
        if window is None or not ahead:
            return window
        return window.extended(ahead)

    def row_inputs(self, tree: DraftTree, ahead: list[int] = ()) -> dict:
        """process_logits' inputs for the rows after each node of `tree` (a root that is the last
        of committed + ahead): each path's penalty window and output counts, the grammar's mask
        at the end of each path, the bias."""
        ahead = list(ahead)
        window, output = self._ahead(self.penalty, ahead), self._ahead(self.output, ahead)
        allowed = None if self.grammar is None else self.grammar.tree_masks(tree, ahead)
        if self.least:
            new = self.length - self.prompt_length + len(ahead)
            allowed = self._early(allowed, tree.shape.depth + new)
        return {"present": None if window is None else window.presence(tree),
                "allowed": allowed,
                "counts": None if output is None else output.tree_counts(tree),
                "bias": self.bias}

    def tree_choices(self, tree: DraftTree, logits: torch.Tensor,
                     ahead: list[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Processed logits [n, vocab] and the token chosen after each node [n]. The root is the
        last of committed + ahead; a node at depth d predicts position length + len(ahead) + d."""
        processed = process_logits(logits, self.config, **self.row_inputs(tree, ahead))
        return processed, self._choose(processed, tree.shape.depth + self.length + len(ahead))

    def chain_choice(self, logits: torch.Tensor, path: list[int]) -> tuple[torch.Tensor, int]:
        """Processed logits [1, vocab] and the token chosen after committed + path: the
        position's Gumbel-max choice, or in rejection mode a fresh sample."""
        present = self.penalty.presence_after(path) if self.penalty is not None else None
        allowed = None if self.grammar is None else self.grammar.mask_after(path)
        if self.least:
            new = self.length - self.prompt_length + len(path)
            allowed = self._early(allowed, torch.tensor([new], device=self.device))
        counts = self.output.counts_after(path) if self.output is not None else None
        processed = process_logits(logits, self.config, present, allowed, self.bias, counts)
        if self.rejection:
            return processed, int(self.sample(processed)[0])
        position = upload([self.length + len(path)], self.device)
        return processed, int(self._choose(processed, position)[0])

    def guess_scores(self, logits: torch.Tensor, first_depth: int, noise: bool = True,
                     same_depth: bool = False, columns: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """Scores [m, vocab] whose top entries are the likeliest choices at depths
        first_depth .. first_depth + m - 1 below the root (all at first_depth when
        `same_depth`: tree nodes of one level): processed logits (penalty over the committed
        window, the bias) plus, when sampling, each position's own Gumbel noise, so that a drafter
        guessing from an approximate distribution aims at the token the target will actually
        pick. With `columns` (token ids [c]) the logits [m, c] are of those tokens only, and
        so are the scores."""
        m = logits.shape[0]
        present = None
        if self.penalty is not None:
            present = self.penalty.presence_after([]).expand(m, -1)
            if columns is not None:
                present = present[:, columns]
        bias = self.bias if self.bias is None or columns is None else self.bias[columns]
        scores = process_logits(logits, self.config, present, bias=bias)
        if noise and self.noise is not None:
            depths = (torch.zeros(m, dtype=torch.long, device=self.device) if same_depth
                      else torch.arange(m, device=self.device))
            scores = self.noise.add(scores, depths + self.length - 1 + first_depth, columns)
        return scores

    def _choose(self, processed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The token each row picks: argmax of processed logits, plus the Gumbel noise of the
        row's absolute position when sampling."""
        if self.noise is None:
            return processed.argmax(dim=-1)
        return self.noise.argmax(processed, positions)

    def sample(self, processed: torch.Tensor) -> torch.Tensor:
        """One fresh sample per row of processed logits (Gumbel-max with the seeded generator)."""
        u = torch.rand(processed.shape, generator=self.rng, device=self.device)
        return (processed - torch.log(-torch.log(u.clamp_min(1e-20)))).argmax(dim=-1)

    def uniform(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.rng, device=self.device)


def choices_together(samplers: list[Sampler], trees: list[DraftTree], logits: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Processed logits [R, vocab] and choices [R] of several generations' trees at once
    (`logits` [R, vocab]: their rows in order), one set of operations for all: each row bitwise
    what its own sampler's tree_choices gives, since process_logits works row by row and the
    noise is keyed by each row's generation (gumbel_keyed). The samplers share one
    SamplingConfig."""
    config = samplers[0].config
    rows = [s.row_inputs(t) for s, t in zip(samplers, trees)]
    vocab, device = logits.shape[-1], logits.device
    # where a member has none of an input, its neutral value
    neutral = {"present": lambda n: torch.zeros(n, vocab, dtype=torch.bool, device=device),
               "allowed": lambda n: torch.ones(n, vocab, dtype=torch.bool, device=device),
               "counts": lambda n: torch.zeros(n, vocab, dtype=torch.int32, device=device),
               "bias": lambda n: torch.zeros(n, vocab, device=device)}
    inputs = {}
    for key, make in neutral.items():
        if any(r[key] is not None for r in rows):
            inputs[key] = torch.cat([make(t.n) if r[key] is None else r[key].expand(t.n, -1)
                                     for r, t in zip(rows, trees)])
    processed = process_logits(logits, config, **inputs)
    if config.greedy:
        return processed, processed.argmax(dim=-1)
    positions = torch.cat([t.shape.depth + s.length for s, t in zip(samplers, trees)])
    keys = [s.noise.key for s, t in zip(samplers, trees) for _ in range(t.n)]
    noise = gumbel_keyed(keys, positions, processed.shape[-1])
    return processed, (processed + noise).argmax(dim=-1)


def samples_together(device: torch.device) -> bool:
    """Whether a batch on `device` chooses its members' tokens in one set of operations over
    all their rows, with one read-back a step (choices_together, verify_trees), where they
    share a sampling setting: on CUDA, where each member's own sampling and read-back cost
    ~1 ms of host time a step (its kernels' launches and its sync: a step of 8 SmolLM2 members
    took 17.5 ms on an H200, one generation's 3.0; docs/benchmarks/cuda.md). Not on a CPU, where one
    member at a time is faster: process_logits over 8 rows of SmolLM2's vocabulary at T=0.7,
    top-p 0.9 took 0.22 ms a row together and 0.07 ms a row alone."""
    return device.type == "cuda"

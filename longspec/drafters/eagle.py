"""EAGLE: a trained one-layer drafter over the target's features, drafting trees as EAGLE-2.

The verify forward returns the target's hidden state at every tree node; after each step the
accepted path's features (through the target's final norm), paired with the tokens that follow
them, go into the drafter's own KV cache (`FeatureCache`): slot p - 1 holds the pair at
position p, with the target's true feature, for every committed position p >= 1, root
included. Its guess at the root's pair ranks the depth-1 candidates.

Drafting (EAGLE-2's dynamic tree): at each depth the `beam` nodes of best path probability, of
those whose path probability, as calibrated by what the target accepted, pays for a depth's
measured time (and reaches `min_path` percent: a confident drafter drafts deep, an unsure one
stops early and costs little), run through the drafter as one block (each seeing
the committed slots, its ancestors' slots and itself; their keys go to scratch slots past the
committed ones, overwritten next step), and each gets its `top_k` candidates as children over
the draft vocabulary, ranked and weighed by the sampler's guess scores (the position's Gumbel
noise included when sampling). The best CANDIDATES * max_nodes nodes by path probability make
the trie; the engine verifies the prefix that pays. Exactness never depends on the drafter.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..heads import store
from ..heads.eagle import EagleDrafterNet, FeatureCache, load_eagle
from ..step.sizing import Calibration
from ..step.tree import CANDIDATES, TrieBuilder
from .base import Budget, TrieDrafter
from .registry import MethodSpec, Option

TOP_K = 8                        # children of each expanded node
BEAM = 4                         # nodes expanded per depth
MIN_PATH = 10                    # percent: a node is expanded when its path probability reaches it
STEP_SMOOTHING = 0.1             # weight of the latest depth's time in the running estimate
CATCH_UP_SCORE_BYTES = 64 * 2**20   # largest attention score buffer of a catch-up chunk


class EagleDrafter(TrieDrafter):
    needs_hidden = True
    plain_steps = True

    def __init__(self, model, drafter, sampler, trust: Calibration, context: int,
                 budget: Budget, *, top_k: int = TOP_K, beam: int = BEAM,
                 min_path: int = MIN_PATH):
        self.net = model.net
        trained = store.resolve(model, drafter, "eagle", "an EAGLE drafter", EagleDrafterNet,
                                load_eagle)
        # its products as the model's, and its LM head over the draft vocabulary [V'] as one
        self.eagle, self.head = trained.for_drafting(model.net)
        self.sampler = sampler
        self.device = model.device
        self.beam = beam
        self.min_path = min_path / 100
        self.depth_time: float | None = None      # seconds of one depth's expansion, smoothed
        self.model = model
        # what the drafter's chances are worth, as the engine calibrates them
        self.trust = trust
        self.cache = FeatureCache(self.eagle.shape, context + budget.max_depth * beam + 1,
                                  model.dtype, model.device)
        self.vocab = self.eagle.vocab             # draft vocabulary [V'], or None: all
        self.top_k = min(top_k, self.head.out_features)
        self.length = 0                          # committed pairs in the feature cache
        self.pending: list[torch.Tensor] = []    # their features [*, hidden], not yet run
        self.root_feature: torch.Tensor | None = None   # [1, hidden]

    def observe_prefill(self, tokens, out) -> None:
        self.pending.append(out.hidden)

    def observe(self, tree, target_out, verdict) -> None:
        index = torch.tensor(verdict.accepted, device=self.device)
        self.pending.append(target_out.forward.hidden[index])

    def run(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
            mask: torch.Tensor) -> torch.Tensor:
        """Guesses [m, hidden] of m pairs whose keys go to slots
        start = mask.shape[1] - m .. (mask [m, start + m])."""
        start = mask.shape[1] - tokens.shape[0]
        embeds = F.embedding(tokens, self.net.embed)
        return self.eagle(embeds, features, positions, self.cache, start, mask)

    def catch_up(self, committed: list[int]) -> torch.Tensor | None:
        """Run the committed pairs not yet in the feature cache into it (causal chunks whose
        score buffers stay bounded); the guess at the root [1, hidden]."""
        if not self.pending:
            return self.root_feature
        features = self.eagle.target_feature(self.net, torch.cat(self.pending))
        self.pending = []
        m = features.shape[0]
        first = len(committed) - m               # the position of the first pending pair
        tokens = torch.tensor(committed[first:], device=self.device)
        per_row = self.eagle.shape.num_heads * 4
        done = 0
        while done < m:
            rows = max(16, CATCH_UP_SCORE_BYTES // (per_row * (self.length + m)))
            rows = min(rows, m - done)
            start = self.length
            mask = torch.zeros(rows, start + rows, dtype=features.dtype, device=self.device)
            mask[:, start:] = torch.full((rows, rows), float("-inf"), dtype=features.dtype,
                                         device=self.device).triu(1)
            positions = torch.arange(first + done, first + done + rows, device=self.device)
            out = self.run(tokens[done:done + rows], features[done:done + rows], positions, mask)
            self.length += rows
            done += rows
        self.root_feature = out[-1:]
        return self.root_feature

    def candidates(self, guesses: torch.Tensor, depth: int
                   ) -> tuple[list[list[int]], list[list[float]]]:
        """The top_k tokens after each guess [m, hidden] at `depth` below the root, and their
        draft probabilities, as host lists [m][top_k]: over the draft vocabulary only, ranked
        and weighed by one distribution, the sampler's guess scores (the position's Gumbel
        noise included when sampling, as the target's choice will have it)."""
        logits = self.head(guesses)
        scores = self.sampler.guess_scores(logits, depth, same_depth=True, columns=self.vocab)
        top = torch.topk(scores, self.top_k, -1)
        probs = torch.softmax(scores, -1).gather(-1, top.indices)
        ids = top.indices if self.vocab is None else self.vocab[top.indices]
        tokens, chances = torch.stack([ids.double(), probs.double()]).tolist()  # one host sync
        return [[int(t) for t in row] for row in tokens], chances

    def least_path(self) -> float:
        """The path probability (calibrated) a node needs to be expanded: min_path, or more
        where a depth of drafting costs more than that share of a target step (measured): a
        child of a node of path probability p saves at most p target steps."""
        step = self.model.state.step_costs.fastest(1)
        if step is None or self.depth_time is None:
            return self.min_path
        return max(self.min_path, self.depth_time / step)

    def add_drafts(self, trie: TrieBuilder, committed: list[int], budget: Budget,
                   source: int = 0) -> None:
        """Add this drafter's best CANDIDATES * max_nodes nodes for the text `committed` to
        `trie` (used by `auto` too)."""
        root_feature = self.catch_up(committed)
        if root_feature is None:
            return
        tokens: list[int] = []
        parents: list[int] = []     # -1: the root
        probs: list[float] = []
        scores: list[float] = []    # path probabilities
        trusted: list[float] = []   # ... as calibrated by what the target accepted
        features: dict[int, torch.Tensor] = {-1: root_feature[0]}   # predicted, per run node
        slots: dict[int, int] = {}  # scratch slot of each run node (counted after the
                                    # committed ones)

        def add_children(rows: list[int], cands: list[list[int]], chances: list[list[float]]
                         ) -> list[int]:
            new = []
            for parent, row_tokens, row_probs in zip(rows, cands, chances):
                base = 1.0 if parent < 0 else scores[parent]
                base_trusted = 1.0 if parent < 0 else trusted[parent]
                for token, p in zip(row_tokens, row_probs):
                    if p > 0:
                        new.append(len(tokens))
                        tokens.append(token)
                        parents.append(parent)
                        probs.append(p)
                        scores.append(base * p)
                        trusted.append(base_trusted * self.trust.chance(source, p))
            return new

        level = add_children([-1], *self.candidates(root_feature, 1))
        root_position = len(committed) - 1
        least = self.least_path()
        for depth in range(1, budget.max_depth):
            frontier = [i for i in sorted(level, key=lambda i: (-scores[i], i))[:self.beam]
                        if trusted[i] >= least]
            if not frontier:
                break
            started = time.perf_counter()
            m, first = len(frontier), len(slots)
            slots.update((node, first + row) for row, node in enumerate(frontier))
            scratch = [[float("-inf")] * len(slots) for _ in frontier]   # ancestors and self
            for row, node in enumerate(frontier):
                ancestor = node
                while ancestor >= 0:
                    scratch[row][slots[ancestor]] = 0.0
                    ancestor = parents[ancestor]
            mask = torch.cat([torch.zeros(m, self.length), torch.tensor(scratch)], dim=1).to(
                device=self.device, dtype=root_feature.dtype)
            out = self.run(torch.tensor([tokens[n] for n in frontier], device=self.device),
                           torch.stack([features[parents[n]] for n in frontier]),
                           torch.full((m,), root_position + depth, device=self.device), mask)
            features.update(zip(frontier, out))
            level = add_children(frontier, *self.candidates(out, depth + 1))
            took = time.perf_counter() - started
            self.depth_time = (took if self.depth_time is None else
                               self.depth_time + STEP_SMOOTHING * (took - self.depth_time))
        # the best nodes by path probability (a child never beats its parent; ties keep the
        # parent first), parents before children
        best = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
        keep = sorted(best[:CANDIDATES * budget.max_nodes - 1])
        placed = {-1: 0}
        for i in keep:
            if placed.get(parents[i]) is not None:
                placed[i] = trie.child(placed[parents[i]], tokens[i], probs[i], source)


SPEC = MethodSpec(
    name="eagle", summary="a trained one-layer drafter over the target's features, "
    "dynamic trees (EAGLE-2)",
    budget=Budget(32, 6), needs_heads=True,
    options={"top_k": Option(TOP_K), "beam": Option(BEAM), "min_path": Option(MIN_PATH, minimum=0)},
    build=lambda s: EagleDrafter(s.model, s.heads, s.sampler, s.sizer.calibration, s.context,
                                 s.budget, top_k=s.options["top_k"], beam=s.options["beam"],
                                 min_path=s.options["min_path"]))

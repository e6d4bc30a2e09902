"""The decoding loop: prefill -> (propose -> verify -> commit) until a stop rule fires.

The engine owns the KV cache, the sampling state and the stop rules; it prints nothing.
Each step runs one target forward over the draft tree (root included) and makes one host
transfer (in `verify_tree`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .cache import StaticCache, causal_mask
from .drafters.base import Budget, Drafter, TargetOutput
from .memory import ensure_fits, peak_bytes
from .models.loader import Model
from .sampler import Sampler
from .stopping import StopRules
from .verify import Verdict, verify_chain_rejection, verify_tree


@dataclass
class StepCounters:
    steps: int = 0
    drafted_tokens: int = 0          # draft tokens offered, on the accepted-length axis
    accepted_draft_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    verify_forward_s: float = 0.0    # time in the verify forwards (CPU only: CUDA is asynchronous)


class Engine:
    """One generation: a prompt in, committed tokens out (as an iterator of chunks)."""

    def __init__(self, model: Model, drafter: Drafter, sampler: Sampler,
                 budget: Budget, max_new_tokens: int, stop: StopRules, method: str):
        self.model = model
        self.net = model.net
        self.drafter = drafter
        self.sampler = sampler
        self.budget = budget
        self.max_new_tokens = max_new_tokens
        self.stop = stop
        self.method = method
        self.device = model.device
        self.counters = StepCounters()
        self.tokens: list[int] = []      # committed: prompt, then new tokens
        self.cache: StaticCache | None = None

    # -- set-up ---------------------------------------------------------------------------------

    def plan_capacity(self, prompt_len: int) -> int:
        """Cache slots: the whole sequence plus room for one draft tree."""
        return prompt_len + self.max_new_tokens + self.budget.max_nodes + 1

    def check_memory(self, prompt_len: int) -> None:
        """Raise ValueError, before anything is allocated, when the KV cache would not fit."""
        cfg = self.model.config
        need = self.plan_capacity(prompt_len) * cfg.kv_bytes_per_token(self.model.dtype.itemsize)
        ensure_fits(need, self.device, f"the KV cache for {prompt_len} prompt + {self.max_new_tokens} "
                    "new tokens", "lower max_new_tokens or the prompt length, or use dtype bfloat16")

    def allocate(self, prompt_len: int) -> None:
        self.net.set_context(prompt_len + self.max_new_tokens)
        self.cache = StaticCache.for_model(self.model.config, self.plan_capacity(prompt_len),
                                           self.model.dtype, self.device)

    def prefill(self, prompt_ids: list[int]) -> None:
        """Put all prompt tokens but the last (the first root) into the cache, in chunks."""
        start = time.perf_counter()
        body = prompt_ids[:-1]
        ids = torch.tensor(body, dtype=torch.long, device=self.device)
        want_logits = self.drafter.needs_prefill_logits
        want_hidden = self.drafter.needs_hidden
        pos = 0
        while pos < len(body):
            chunk = self.net.prefill_chunk(pos + 1024)
            toks = ids[pos:pos + chunk]
            q = toks.shape[0]
            positions = torch.arange(pos, pos + q, device=self.device)
            out = self.net(toks, positions, self.cache, causal_mask(q, self.model.dtype, self.device),
                           need_logits=want_logits, return_hidden=want_hidden)
            if want_logits or want_hidden:
                self.drafter.observe_prefill(toks, out)
            self.cache.commit(q)
            pos += q
        self.tokens = list(prompt_ids)
        self.sampler.commit(prompt_ids)
        self.drafter.prefill(list(prompt_ids), self.cache)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.counters.prefill_s = time.perf_counter() - start

    # -- one step ---------------------------------------------------------------------------------

    def step(self) -> Verdict:
        tree = self.drafter.propose(self.tokens, self.budget)
        shape = tree.shape
        positions = shape.depth + self.cache.length
        start = time.perf_counter()
        out = self.net(tree.tokens, positions, self.cache, shape.mask(self.model.dtype),
                       return_hidden=self.drafter.needs_hidden)
        self.counters.verify_forward_s += time.perf_counter() - start
        processed, target = self.sampler.tree_choices(tree, out.logits)
        if self.sampler.rejection and tree.draft_probs is not None:
            verdict = verify_chain_rejection(tree, processed, self.sampler)
        else:
            verdict = verify_tree(tree, target)
        self.cache.keep(verdict.accepted)
        self.drafter.observe(tree, TargetOutput(out, processed, target), verdict)
        c = self.counters
        c.steps += 1
        c.drafted_tokens += shape.max_depth
        c.accepted_draft_tokens += verdict.accept_length
        return verdict

    def commit(self, new: list[int]) -> None:
        self.tokens.extend(new)
        self.sampler.commit(new)
        self.counters.new_tokens += len(new)

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, prompt_ids: list[int]) -> Iterator[list[int]]:
        """Yield new tokens in the chunks each step commits."""
        self.allocate(len(prompt_ids))
        self.prefill(prompt_ids)
        start = time.perf_counter()
        try:
            while self.counters.new_tokens < self.max_new_tokens:
                new = self.step().tokens
                room = self.max_new_tokens - self.counters.new_tokens
                keep = self.stop.cut(new)
                done = keep is not None or len(new) >= room
                new = new[:min(keep or len(new), room)]
                self.commit(new)
                self.counters.decode_s = time.perf_counter() - start
                yield new
                if done:
                    break
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.counters.decode_s = time.perf_counter() - start

    def stats(self) -> dict:
        c = self.counters
        return {
            "new_tokens": c.new_tokens,
            "steps": c.steps,
            "drafted_tokens": c.drafted_tokens,
            "accepted_draft_tokens": c.accepted_draft_tokens,
            "acceptance_rate": c.accepted_draft_tokens / c.drafted_tokens if c.drafted_tokens else 0.0,
            "mean_accepted_length": c.new_tokens / c.steps if c.steps else 0.0,
            "prefill_s": c.prefill_s,
            "decode_s": c.decode_s,
            "tokens_per_s": c.new_tokens / c.decode_s if c.decode_s > 0 else 0.0,
            "verify_forward_s": c.verify_forward_s if self.device.type == "cpu" else None,
            "peak_memory_bytes": peak_bytes(self.device),
            "method": self.method,
            "device": str(self.device),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            **self.drafter.stats(),
        }

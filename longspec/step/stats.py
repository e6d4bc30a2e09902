"""The counters of one generation, and the statistics derived from them (one definition for the
engine's result, the progress bar and the benchmark)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    method: str
    device: str
    dtype: str
    weights: str = ""                # the matrices' format: a dtype, or "int4" (quantized)
    kernel_profile: dict | None = None   # the model's KernelProfile (models/profile.py)
    # the profile's: "on", or "off (why): ..." where no kernel path passed the row check (every
    # step was then `ar`'s)
    speculation: str = "on"
    steps: int = 0                   # verify forwards
    # ... of them, steps whose tree was cut to a size being timed (step/sizing.py), not chosen for
    # what it pays (their tokens committed)
    timing_steps: int = 0
    verified_nodes: int = 0          # tree nodes over all verify forwards, roots included
    drafted_tokens: int = 0          # draft tokens offered, on the accepted-length axis
    accepted_draft_tokens: int = 0   # accepted draft tokens that were committed
    forced_tokens: int = 0           # draft tokens a grammar forced (outputs/grammar.py), verified
    accepted_forced_tokens: int = 0  # ... of them, committed
    new_tokens: int = 0
    prefill_s: float = 0.0
    cached_tokens: int = 0           # prompt tokens whose keys and values the prompt cache held
    first_token_s: float = 0.0       # from the start of the prefill to the first new token
    decode_s: float = 0.0            # the decoding loop's seconds, less the caller's with chunks
    verify_forward_s: float = 0.0    # time in the verify forwards (CPU only: CUDA is asynchronous)
    sizing_s: float = 0.0            # time timing throwaway steps for adaptive sizing (in decode_s)
    peak_memory_bytes: int = 0       # see memory.PeakMemory

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (TokenSwift's alpha); None when nothing was drafted."""
        return self.accepted_draft_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def mean_accepted_length(self) -> float:
        """New tokens per verify step, the bonus token included (as Spec-Bench and vLLM count)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "timing_steps": self.timing_steps,
            "drafted_tokens": self.drafted_tokens,
            "accepted_draft_tokens": self.accepted_draft_tokens,
            "forced_tokens": self.forced_tokens,
            "accepted_forced_tokens": self.accepted_forced_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "mean_tree_nodes": self.verified_nodes / self.steps if self.steps else 0.0,
            "prefill_s": self.prefill_s,
            "cached_tokens": self.cached_tokens,
            "first_token_s": self.first_token_s,
            "decode_s": self.decode_s,
            "tokens_per_s": self.tokens_per_s,
            "verify_forward_s": self.verify_forward_s if self.device == "cpu" else None,
            "sizing_s": self.sizing_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "method": self.method,
            "device": self.device,
            "dtype": self.dtype,
            "weights": self.weights,
            "kernel_profile": self.kernel_profile,
            "speculation": self.speculation,
        }

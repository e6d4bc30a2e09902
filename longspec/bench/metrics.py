"""Output diversity, memory bandwidth and the decoding roofline."""

from __future__ import annotations

import time

import torch

# distinct-4 under which a text has become a loop, which any suffix drafter copies: a speed
# measured on it says little about text that stays text, so rows under it are labelled a loop
# and left out of summaries
DEGENERATE = 0.3


def distinct_n(tokens: list[int], n: int) -> float:
    """Distinct-n: distinct n-grams / all n-grams of the output (0 when it has none)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def is_loop(tokens: list[int]) -> bool:
    """Whether the text has become a loop (distinct-4 under DEGENERATE)."""
    return distinct_n(tokens, 4) < DEGENERATE


def answer_end(tokens: list[int], eos_token_ids) -> int | None:
    """Where the answer first reached end-of-sequence (a run that ignores it goes on past it
    with whatever the model writes there), or None."""
    return next((i for i, t in enumerate(tokens) if t in eos_token_ids), None)


def measure_bandwidth(device: torch.device, mib: int = 256, repeats: int = 5) -> float:
    """Read bandwidth in bytes/s: the best of `repeats` sums over a `mib` MiB buffer."""
    x = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        x.sum().item()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best


def decode_bytes(weight_bytes: int, kv_bytes_per_token: int, context: int) -> int:
    """Bytes one plain decoding step must read: every weight once, the KV of `context` tokens."""
    return weight_bytes + kv_bytes_per_token * context


def roofline_ms(weight_bytes: int, kv_bytes_per_token: int, context: int,
                bandwidth: float) -> float:
    """Milliseconds per token that plain decoding cannot beat at `bandwidth` bytes/s."""
    return 1e3 * decode_bytes(weight_bytes, kv_bytes_per_token, context) / bandwidth


def mean_roofline_ms(weight_bytes: int, kv_bytes_per_token: int, prompt_len: int, gen_len: int,
                     bandwidth: float) -> float:
    """Roofline per token averaged over a generation whose context grows from prompt_len."""
    mean_context = prompt_len + (gen_len - 1) / 2
    return roofline_ms(weight_bytes, kv_bytes_per_token, mean_context, bandwidth)

"""What the training loops share (the demo models, multi-token heads)."""

from __future__ import annotations

import math


def warmup_cosine(step: int, steps: int, warmup: int, peak: float, floor: float = 0.0) -> float:
    """Learning rate at `step`: linear warmup to `peak`, then cosine decay to floor * peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

"""A live progress bar on stderr: tokens, tokens/s, ETA and the acceptance rate."""

from __future__ import annotations

import sys

from tqdm import tqdm


class ProgressBar:
    def __init__(self, total: int, enabled: bool = True, desc: str = "generate"):
        self.bar = tqdm(total=total, unit="tok", desc=desc, file=sys.stderr, dynamic_ncols=True,
                        disable=not enabled, smoothing=0.1)

    def update(self, n: int, counters) -> None:
        """Advance by n tokens; show the acceptance rate and mean accepted length so far."""
        if self.bar.disable:
            return
        self.bar.update(n)
        if counters.drafted_tokens:
            alpha = counters.accepted_draft_tokens / counters.drafted_tokens
            length = counters.new_tokens / counters.steps
            self.bar.set_postfix_str(f"alpha={alpha:.2f} len={length:.2f}", refresh=False)

    def close(self) -> None:
        self.bar.close()

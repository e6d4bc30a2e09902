"""A live progress bar on stderr: tokens, tokens/s, ETA and the acceptance rate."""

from __future__ import annotations

import sys

from tqdm import tqdm

from .step.stats import Stats


class ProgressBar:
    def __init__(self, total: int, enabled: bool = True, desc: str = "generate"):
        self.bar = tqdm(total=total, unit="tok", desc=desc, file=sys.stderr, dynamic_ncols=True,
                        disable=not enabled, smoothing=0.1)

    def update(self, n: int, stats: Stats) -> None:
        """Advance by n tokens; show the time to the first token (and the prompt tokens the
        prompt cache held), the acceptance rate and mean accepted length so far."""
        if self.bar.disable:
            return
        self.bar.update(n)
        shown = [f"first={stats.first_token_s:.2f}s"]
        if stats.cached_tokens:
            shown.append(f"cached={stats.cached_tokens}")
        if stats.acceptance_rate is not None:
            shown += [f"alpha={stats.acceptance_rate:.2f}", f"len={stats.mean_accepted_length:.2f}"]
        self.bar.set_postfix_str(" ".join(shown), refresh=False)

    def close(self) -> None:
        self.bar.close()

"""Stop rules, looking only at new tokens: EOS, stop token ids and stop strings.

Stop strings are searched in the decoded text of a short window of the latest tokens, so the
cost per step does not grow with the output.
"""

from __future__ import annotations

FINISH_REASONS = ("eos", "stop", "length", "interrupted")


class StopRules:
    def __init__(self, eos_ids: set[int], stop_ids: set[int], stop_strings: list[str], tokenizer,
                 least: int = 0):
        """`least`: the new tokens that come before any rule may end the generation
        (min_new_tokens; the sampler never chooses an ending id before then)."""
        if stop_strings and tokenizer is None:
            raise ValueError("stop strings need a tokenizer; pass stop token ids instead")
        self.least = least
        self.seen = 0                       # new tokens cut has looked at
        self.eos_ids = eos_ids
        self.stop_ids = stop_ids
        self.stop_strings = stop_strings
        self.tokenizer = tokenizer
        # a character is at most 4 bytes, a byte-level token at least one byte
        self.window = 4 * max((len(s) for s in stop_strings), default=0) + 4
        self.recent: list[int] = []
        self.reason: str | None = None      # "eos" or "stop" once a rule fired
        self.by_string = False              # the rule that fired was a stop string

    def cut(self, new_tokens: list[int]) -> int | None:
        """Number of `new_tokens` to keep when one of them ends the generation (the stop token
        or the token completing a stop string included), else None."""
        for i, token in enumerate(new_tokens):
            self.seen += 1
            early = self.seen <= self.least
            if not early and (token in self.eos_ids or token in self.stop_ids):
                self.reason = "eos" if token in self.eos_ids else "stop"
                return i + 1
            if self.stop_strings:
                self.recent.append(token)
                del self.recent[:-self.window]
                text = self.tokenizer.decode(self.recent)
                if not early and any(s in text for s in self.stop_strings):
                    self.reason, self.by_string = "stop", True
                    return i + 1
        return None

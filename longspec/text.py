"""Incremental detokenization for streaming: each call decodes only a short recent window.

Byte-level tokens may end inside a UTF-8 character; text is released once it no longer ends in
a replacement character, so a stream never shows half a character.
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, prompt_tail: list[int] | None = None):
        self.tokenizer = tokenizer
        # decoding starts from a few prompt tokens so that the first word gets its spacing
        self.ids: list[int] = list(prompt_tail or [])
        self.prefix = 0                 # ids[:prefix] are settled and no longer decoded
        self.read = len(self.ids)       # ids[prefix:read] decode to text already released

    def push(self, new_ids: list[int]) -> str:
        """Text that `new_ids` add to the stream (possibly empty)."""
        self.ids.extend(new_ids)
        before = self.tokenizer.decode(self.ids[self.prefix:self.read])
        after = self.tokenizer.decode(self.ids[self.prefix:])
        if after.endswith("\ufffd") or len(after) < len(before) or not after.startswith(before):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream."""
        before = self.tokenizer.decode(self.ids[self.prefix:self.read])
        after = self.tokenizer.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after.removeprefix(before)

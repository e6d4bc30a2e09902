"""Text in and out: reading text files, and incremental detokenization for streaming, where
each call decodes only a short recent window.

Byte-level tokens may end inside a UTF-8 character; text is released once it no longer ends in
a replacement character, so a stream never shows half a character. The tokens released last
stay as context for the next decode, so that spacing between words comes out right.
"""

from __future__ import annotations

from pathlib import Path


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of a file; a ValueError naming `what` when it is missing or not text."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{what} {str(path)!r} not found")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {str(path)!r} is not UTF-8 text") from None


class Detokenizer:
    def __init__(self, tokenizer, prompt_tail: list[int] | None = None):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_tail or [])   # context, then tokens not yet released
        self.read = len(self.ids)                         # ids[:read] is context already shown

    def _delta(self) -> tuple[str, str]:
        before = self.tokenizer.decode(self.ids[:self.read])
        return before, self.tokenizer.decode(self.ids)

    def push(self, new_ids: list[int]) -> str:
        """Text that `new_ids` add to the stream (possibly empty)."""
        self.ids.extend(new_ids)
        before, after = self._delta()
        if after.endswith("\ufffd") or not after.startswith(before):
            return ""
        del self.ids[:self.read]
        self.read = len(self.ids)
        return after[len(before):]

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream."""
        before, after = self._delta()
        self.ids, self.read = [], 0
        return after.removeprefix(before)

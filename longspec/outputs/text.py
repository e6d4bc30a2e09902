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
    if file.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a directory, not a file")
    if not file.is_file():
        raise ValueError(f"{what} {str(path)!r} not found")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {str(path)!r} is not UTF-8 text") from None


def decode(tokenizer, ids: list[int], keep_special: bool | frozenset[int]) -> str:
    """The text of `ids` with every special token kept, none, or these ones (a tool call's
    marker that the vocabulary holds as a special token, as Mistral's [TOOL_CALLS])."""
    if isinstance(keep_special, bool):
        return tokenizer.decode(ids, skip_special_tokens=not keep_special)
    pieces, start = [], 0
    for i, token in enumerate(ids):
        if token in keep_special:
            pieces += [tokenizer.decode(ids[start:i], skip_special_tokens=True),
                       tokenizer.decode([token])]
            start = i + 1
    return "".join(pieces) + tokenizer.decode(ids[start:], skip_special_tokens=True)


class Detokenizer:
    def __init__(self, tokenizer, prompt_tail: list[int] | None = None,
                 keep_special: bool | frozenset[int] = False):
        self.tokenizer = tokenizer
        self.keep_special = keep_special
        self.ids: list[int] = list(prompt_tail or [])   # context, then tokens not yet released
        self.read = len(self.ids)                         # ids[:read] is context already shown

    def _delta(self) -> tuple[str, str]:
        before = decode(self.tokenizer, self.ids[:self.read], self.keep_special)
        return before, decode(self.tokenizer, self.ids, self.keep_special)

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


class TextStream:
    """The text of the new tokens as it grows, as a user should see it: special tokens left
    out (unless kept), and the stop string that ends the run cut off with what follows it
    (unless included). Text that could still turn out to be part of a stop string is held
    back until the next tokens settle it."""

    def __init__(self, tokenizer, prompt_tail: list[int], stop_strings: list[str],
                 keep_special: bool | frozenset[int], include_stop: bool):
        self.detok = Detokenizer(tokenizer, prompt_tail, keep_special)
        self.stops = [] if include_stop else stop_strings
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""

    def push(self, ids: list[int]) -> str:
        self.pending += self.detok.push(ids)
        cut = len(self.pending) - self.hold
        if cut <= 0:
            return ""
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def finish(self, ids: list[int], stopped_by_string: bool) -> str:
        """The text of the last tokens and all that was held back, cut at the stop string
        when one ended the run."""
        rest = self.pending + self.detok.push(ids) + self.detok.flush()
        self.pending = ""
        return cut_at_stop(rest, self.stops) if stopped_by_string else rest


def cut_at_stop(text: str, stop_strings: list[str]) -> str:
    """`text` up to the earliest stop string in it (all of it when none is)."""
    ends = [i for i in (text.find(s) for s in stop_strings) if i >= 0]
    return text[:min(ends)] if ends else text

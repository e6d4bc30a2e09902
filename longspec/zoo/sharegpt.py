"""ShareGPT V3 (the unfiltered cleaned split, `longspec fetch sharegpt`): chat data for training
drafters and for benchmark prompts.

The packaged file is cut off mid-record: a JSON array of conversations whose end is missing.
`conversations` reads the records one by one and stops at the first incomplete one (17,671
complete conversations in the packaged file). `held_out` splits by conversation, so that no
held-out answer shares a conversation with a training one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: list[tuple[str, str]]     # (who, text): "human", "gpt" or "system"

    def answers(self) -> list[str]:
        """The model's turns."""
        return [text for who, text in self.turns if who == "gpt"]


def conversations(path: Path | str) -> Iterator[Conversation]:
    """The complete records of a ShareGPT JSON array, in order, up to the first incomplete one
    (records without a conversation list are skipped)."""
    text = Path(path).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    at = text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            return
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return                    # the cut: this record and everything after it are gone
        turns = record.get("conversations") if isinstance(record, dict) else None
        if isinstance(turns, list):
            yield Conversation(str(record.get("id", "")),
                               [(str(t.get("from", "")), str(t.get("value", ""))) for t in turns
                                if isinstance(t, dict)])


def held_out(conversation: Conversation, percent: int = 5) -> bool:
    """Whether a conversation belongs to the held-out split (`percent` of them, by a hash of its
    id's stem: the parts of one conversation, ids "X_0", "X_1", ..., fall on one side)."""
    stem = conversation.id.rsplit("_", 1)[0]
    return int(hashlib.sha256(stem.encode()).hexdigest(), 16) % 100 < percent

"""Training data for drafters: a token stream from text files, fixed-length windows of it, and
the frozen target's features and next-token logits over each window (self-distillation)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cache import StaticCache, causal_mask
from ..text import read_text_file

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")


def data_files(paths: list[str | Path]) -> list[Path]:
    """The files to train on: files as given; for a directory, its UTF-8 .py, .txt, .md and
    .rst files outside test suites and third-party packages (as the demo models' data),
    sorted."""
    from ..zoo.data import EXCLUDED_DIRS

    if not paths:
        raise ValueError("give at least one --data file or directory")
    out: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            out.append(path)
            continue
        found = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()
                       and not EXCLUDED_DIRS.intersection(p.relative_to(path).parts[:-1])
                       and _is_utf8(p))
        if not found:
            raise ValueError(f"data directory {str(path)!r} holds no {', '.join(TEXT_SUFFIXES)} "
                             "files")
        out.extend(found)
    return out


def _is_utf8(path: Path) -> bool:
    try:
        path.read_bytes().decode("utf-8")
    except (UnicodeDecodeError, OSError):
        return False
    return True


def read_token_stream(model, files: list[Path]) -> torch.Tensor:
    """The files' texts tokenized and concatenated: [n] long."""
    if model.tokenizer is None:
        raise ValueError(f"{model.path} has no tokenizer; drafters are trained on text")
    ids: list[int] = []
    for f in files:
        ids.extend(model.tokenizer(read_text_file(f, "data file"))["input_ids"])
    return torch.tensor(ids, dtype=torch.long)


def stream_digest(stream: torch.Tensor) -> str:
    """Identifies a token stream (a checkpoint continues only on the same data)."""
    return hashlib.blake2b(stream.numpy().tobytes(), digest_size=8).hexdigest()


def sample_windows(stream: torch.Tensor, batch_size: int, seq_len: int,
                   gen: torch.Generator) -> torch.Tensor:
    """[batch_size, seq_len] windows of the stream at random starts."""
    starts = torch.randint(0, len(stream) - seq_len, (batch_size,), generator=gen)
    return torch.stack([stream[s:s + seq_len] for s in starts.tolist()])


@dataclass(frozen=True)
class TargetBatch:
    tokens: torch.Tensor          # [B, T] on the model's device
    hidden: torch.Tensor          # [B, T, hidden] float32: features (before the final norm)
    logits: torch.Tensor | None   # [B, T, vocab] float32: the target's next-token logits


@torch.no_grad()
def target_batch(model, windows: torch.Tensor, want_logits: bool) -> TargetBatch:
    """The frozen target's outputs over each window, run alone from position 0."""
    net = model.net
    seq_len = windows.shape[1]
    mask = causal_mask(seq_len, net.dtype, net.device)
    positions = torch.arange(seq_len, device=net.device)
    hidden, logits = [], []
    for seq in windows:
        cache = StaticCache(model.config, seq_len, net.dtype, net.device)
        out = net(seq.to(net.device), positions, cache, mask, return_hidden=True,
                  need_logits=want_logits)
        hidden.append(out.hidden.float())
        if want_logits:
            logits.append(out.logits.float())
    return TargetBatch(windows.to(net.device), torch.stack(hidden),
                       torch.stack(logits) if want_logits else None)

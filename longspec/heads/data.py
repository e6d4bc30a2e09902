"""Training data for drafters: a token stream from text files, fixed-length windows of it, and
the frozen target's features and next-token logits over each window (self-distillation)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

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


def sample_windows(count: int, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """[batch_size] indices of windows among `count`, drawn with replacement."""
    return torch.randint(0, count, (batch_size,), generator=gen)


@dataclass(frozen=True)
class TargetBatch:
    tokens: torch.Tensor          # [B, T] on the model's device
    hidden: torch.Tensor          # [B, T, hidden] float32: features (before the final norm)
    logits: torch.Tensor | None   # [B, T, vocab] float32: the target's next-token logits


class TargetFeatures:
    """The frozen target's features over a token stream cut into windows of `seq_len`
    tokens, each run alone from position 0. They are computed once, kept in the model's dtype
    (exactly what its forward gives), and serve every step that draws the window; the
    target's logits, when a batch needs them, come from them through its final norm and LM
    head, as in its forward."""

    def __init__(self, model, stream: torch.Tensor, seq_len: int, progress: bool = False,
                 desc: str = "target features"):
        net = model.net
        count = len(stream) // seq_len
        self.model = model
        self.windows = stream[:count * seq_len].view(count, seq_len).to(net.device)
        self.hidden = torch.empty(count, seq_len, model.config.hidden_size, dtype=net.dtype,
                                  device=net.device)
        mask = causal_mask(seq_len, net.dtype, net.device)
        positions = torch.arange(seq_len, device=net.device)
        cache = StaticCache(model.config, seq_len, net.dtype, net.device)
        with torch.no_grad():
            for i in tqdm(range(count), desc=desc, disable=not progress, dynamic_ncols=True):
                out = net(self.windows[i], positions, cache, mask, return_hidden=True,
                          need_logits=False)
                self.hidden[i] = out.hidden

    def __len__(self) -> int:
        return self.windows.shape[0]

    @torch.no_grad()
    def batch(self, index: torch.Tensor, want_logits: bool) -> TargetBatch:
        """The windows `index` [B] with their features (and the target's logits)."""
        hidden = self.hidden[index.to(self.hidden.device)]
        logits = None
        if want_logits:
            flat = self.model.net.hidden_to_logits(hidden.flatten(0, 1))
            logits = flat.view(*hidden.shape[:2], -1).float()
        return TargetBatch(self.windows[index.to(self.windows.device)], hidden.float(), logits)

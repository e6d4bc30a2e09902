"""Training data for drafters: a token stream (text files, or chat conversations through the
model's chat template, with their answer tokens marked), fixed-length windows of it, and the
frozen target's features and next-token logits over each window (self-distillation)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..cache import StaticCache, causal_mask
from ..outputs.text import read_text_file

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")
SHARD_TOKENS = 32768            # the target's features are kept on disk in shards of this many
SHARD = "part-{:05d}.pt"
# the training's and the held-out features' directories: both kinds' trainings in one
# directory on the same data share them
FEATURES = "features-{part}"


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


@dataclass(frozen=True)
class TokenStream:
    ids: torch.Tensor       # [n] long
    answer: torch.Tensor    # [n] bool: the token is part of an answer (all of plain text)

    def __len__(self) -> int:
        return len(self.ids)

    def split(self, at: int) -> tuple[TokenStream, TokenStream]:
        return (TokenStream(self.ids[:at], self.answer[:at]),
                TokenStream(self.ids[at:], self.answer[at:]))

    def digest(self) -> str:
        """Identifies the stream (a checkpoint continues only on the same data)."""
        h = hashlib.blake2b(self.ids.numpy().tobytes(), digest_size=8)
        h.update(self.answer.numpy().tobytes())
        return h.hexdigest()


def read_token_stream(model, files: list[Path]) -> TokenStream:
    """The files' texts tokenized and concatenated, every token an answer token."""
    _need_tokenizer(model)
    ids: list[int] = []
    for f in files:
        ids.extend(model.tokenizer(read_text_file(f, "data file"))["input_ids"])
    return TokenStream(torch.tensor(ids, dtype=torch.long), torch.ones(len(ids), dtype=torch.bool))


def _need_tokenizer(model) -> None:
    if model.tokenizer is None:
        raise ValueError(f"{model.path} has no tokenizer; drafters are trained on text")


ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
MAX_CONVERSATION_CHARS = 16_000     # a conversation is cut after the turn that passes this


def chat_tokens(model, turns: list[tuple[str, str]]) -> tuple[list[int], list[bool]] | None:
    """A conversation [(who, text)] ("human", "gpt", "system") through the model's chat
    template: its token ids and which of them are an answer's (the assistant's text and its
    end of turn, not the turn's header). None when the template renders it not as a sequence
    of prefixes (or refuses it)."""
    from jinja2 import TemplateError

    tok = model.tokenizer
    messages: list[dict] = []
    chars = 0
    for who, text in turns:
        if who in ROLES and text and chars < MAX_CONVERSATION_CHARS:
            messages.append({"role": ROLES[who], "content": text})
            chars += len(text)

    def render(upto: int, opened: bool = False) -> list[int]:
        return list(tok.apply_chat_template(messages[:upto], add_generation_prompt=opened,
                                            tokenize=True, return_dict=False))

    try:
        ids = render(len(messages))
        answer = [False] * len(ids)
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            opened, closed = render(i, opened=True), render(i + 1)
            if opened != ids[:len(opened)] or closed != ids[:len(closed)]:
                return None
            answer[len(opened):len(closed)] = [True] * (len(closed) - len(opened))
    except (TemplateError, ValueError, TypeError):  # a template refusing a role order
        return None
    return (ids, answer) if any(answer) else None


def chat_stream(model, conversations, max_tokens: int, progress: bool = False,
                desc: str = "conversations") -> TokenStream:
    """Conversations ([(who, text)] each) through the chat template, concatenated, up to
    `max_tokens` tokens (the last one cut there)."""
    _need_tokenizer(model)
    if not getattr(model.tokenizer, "chat_template", None):
        raise ValueError(f"{model.name} has no chat template: train on text files (--data)")
    ids: list[int] = []
    answer: list[bool] = []
    bar = tqdm(total=max_tokens, desc=desc, unit="tok", disable=not progress,
               dynamic_ncols=True)
    for turns in conversations:
        if len(ids) >= max_tokens:
            break
        rendered = chat_tokens(model, turns)
        if rendered is not None:
            bar.update(min(len(rendered[0]), max_tokens - len(ids)))
            ids.extend(rendered[0])
            answer.extend(rendered[1])
    bar.close()
    return TokenStream(torch.tensor(ids[:max_tokens], dtype=torch.long),
                       torch.tensor(answer[:max_tokens], dtype=torch.bool))


def _windows_digest(windows: torch.Tensor) -> str:
    return hashlib.blake2b(windows.cpu().numpy().tobytes(), digest_size=8).hexdigest()


def sample_windows(count: int, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """[batch_size] indices of windows among `count`, drawn with replacement."""
    return torch.randint(0, count, (batch_size,), generator=gen)


@dataclass(frozen=True)
class TargetBatch:
    tokens: torch.Tensor          # [B, T] on the model's device
    answer: torch.Tensor          # [B, T] bool: answer tokens
    hidden: torch.Tensor          # [B, T, hidden] float32: features (before the final norm)
    logits: torch.Tensor | None   # [B, T, vocab] float32: the target's next-token logits


class TargetFeatures:
    """The frozen target's features over a token stream cut into windows of `seq_len`
    tokens, each run alone from position 0. They are computed once, kept in the model's dtype
    (exactly what its forward gives: bfloat16 as longspec runs a GGUF), and serve every step
    that draws the window; the target's logits, when a batch needs them, come from them
    through its final norm and LM head, as in its forward.

    Kept on disk (`keep`, a directory), they are written in shards of SHARD_TOKENS tokens as
    the pass goes: an interrupted pass continues from the last shard written, and a shard is
    read back wherever its windows, the model and the window length are the same (a longer
    stream of the same data reuses the shards of its beginning)."""

    def __init__(self, model, stream: TokenStream, seq_len: int, progress: bool = False,
                 desc: str = "target features", keep: Path | None = None):
        from ..heads.store import fingerprint

        net = model.net
        count = len(stream) // seq_len
        self.model = model
        self.windows = stream.ids[:count * seq_len].view(count, seq_len).to(net.device)
        self.answer = stream.answer[:count * seq_len].view(count, seq_len).to(net.device)
        self.hidden = torch.empty(count, seq_len, model.config.hidden_size, dtype=net.dtype,
                                  device=net.device)
        per_shard = max(1, SHARD_TOKENS // seq_len)
        model_key = f"{fingerprint(model)} {model.weight_format} {seq_len} {net.dtype}"
        shards = [slice(first, min(first + per_shard, count))
                  for first in range(0, count, per_shard)]
        todo = []
        for i, shard in enumerate(shards):
            key = f"{_windows_digest(self.windows[shard])} {model_key}"
            path = None if keep is None else Path(keep) / SHARD.format(i)
            if path is not None and path.is_file():
                saved = torch.load(path, map_location=net.device, weights_only=True)
                if saved.get("key") == key:
                    self.hidden[shard] = saved["hidden"]
                    continue
            todo.append((shard, key, path))
        done = count - sum(shard.stop - shard.start for shard, _, _ in todo)
        mask = causal_mask(seq_len, net.dtype, net.device)
        positions = torch.arange(seq_len, device=net.device)
        cache = StaticCache(model.config, seq_len, net.dtype, net.device)
        with torch.no_grad(), tqdm(total=count, initial=done, desc=desc, unit="window",
                                   disable=not progress, dynamic_ncols=True) as bar:
            for shard, key, path in todo:
                for i in range(shard.start, shard.stop):
                    out = net(self.windows[i], positions, cache, mask, return_hidden=True,
                              need_logits=False)
                    self.hidden[i] = out.hidden
                    bar.update(1)
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_suffix(".tmp")
                    torch.save({"key": key, "hidden": self.hidden[shard].clone()}, tmp)
                    os.replace(tmp, path)

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
        index = index.to(self.windows.device)
        return TargetBatch(self.windows[index], self.answer[index], hidden.float(), logits)


def features_dirs(out: str | Path | None) -> dict[str, Path | None]:
    """Where `target_features` keeps the training's and the held-out features in `out`."""
    return {part: None if out is None else Path(out) / FEATURES.format(part=part)
            for part in ("train", "held")}


def target_features(model, train: TokenStream, held: TokenStream, seq_len: int,
                    out: str | Path | None, progress: bool
                    ) -> tuple[TargetFeatures, TargetFeatures]:
    """The target's features over the training and held-out windows, kept in `out`."""
    kept = features_dirs(out)
    return (TargetFeatures(model, train, seq_len, progress, "target features (train)",
                           kept["train"]),
            TargetFeatures(model, held, seq_len, progress, "target features (held out)",
                           kept["held"]))

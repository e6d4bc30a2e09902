"""Train a drafter (EAGLE feature drafter or multi-token heads) on a frozen target.

The training text is cut into windows of `seq_len` tokens and the frozen target runs over
each once (its features, `TargetFeatures`); each step draws `batch_size` of those windows and
takes one AdamW step on the drafter's loss (objectives.py); linear warmup, then cosine
decay. Every `checkpoint_every` steps, and on Ctrl-C, the drafter, the optimizer and the
data sampler's state go to `<out>/<kind>.checkpoint.pt`: running the same training again
continues from there and ends with the weights an uninterrupted run gives; a checkpoint of
other settings, data or model is refused. At the end the drafter is saved with a record of
the run (held-out loss and agreement with the target before and after, loss curve, seconds,
data) and the checkpoint removed.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from ..training import warmup_cosine
from . import objectives, store
from .data import TargetFeatures, data_files, read_token_stream, sample_windows, stream_digest
from .module import GAMMA

TARGETS = ("text", "distill")
LR = {"eagle": 3e-3, "heads": 5e-3}      # TokenSwift's for heads
CHECKPOINT = "{kind}.checkpoint.pt"    # one per kind: a directory may hold both
EVAL_BATCHES = 4
EVAL_SEED = 12345


@dataclass(frozen=True)
class DrafterTraining:
    kind: str = "eagle"           # "eagle" or "heads"
    steps: int = 200
    lr: float | None = None       # None: the kind's default (LR)
    warmup_steps: int = 20
    weight_decay: float = 0.1
    batch_size: int = 8
    seq_len: int = 512
    target: str = "distill"       # the target's own distribution, or the text ("text")
    gamma: int = GAMMA            # heads
    feature_weight: float = 1.0   # eagle: smooth L1 of the predicted features
    token_weight: float = 0.1     # eagle: cross-entropy of their logits
    draft_vocab: int = 0          # eagle: guess among this many most frequent tokens (0: all)
    seed: int = 0
    held_out: float = 0.05        # share of the token stream kept for evaluation
    checkpoint_every: int = 50    # steps

    def validate(self) -> DrafterTraining:
        """Checked, with the learning rate filled in."""
        if self.kind not in store.KINDS:
            raise ValueError(f"kind must be one of {', '.join(store.KINDS)}, got {self.kind!r}")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        for name in ("steps", "batch_size", "gamma", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.draft_vocab < 0:
            raise ValueError(f"draft_vocab must be 0 (the whole vocabulary) or more, got "
                             f"{self.draft_vocab}")
        if self.seq_len < self.gamma + 2:
            raise ValueError(f"seq_len must be at least {self.gamma + 2}")
        lr = LR[self.kind] if self.lr is None else self.lr
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive number, got {lr}")
        if not 0 < self.held_out < 1:
            raise ValueError(f"held_out must be between 0 and 1, got {self.held_out}")
        return replace(self, lr=lr)

    def settings(self) -> dict:
        """What a checkpoint must share to be continued (all but checkpoint_every)."""
        return {k: v for k, v in asdict(self).items() if k != "checkpoint_every"}


def evaluate(module, model, held: TargetFeatures, cfg: DrafterTraining) -> tuple[float, list]:
    """Mean held-out loss and agreement per depth on fixed batches."""
    gen = torch.Generator().manual_seed(EVAL_SEED)
    loss_fn = objectives.LOSSES[cfg.kind]
    losses, agreements = [], []
    with torch.no_grad():
        for _ in range(EVAL_BATCHES):
            index = sample_windows(len(held), cfg.batch_size, gen)
            loss, agreement = loss_fn(module, model, held.batch(index, True), cfg)
            losses.append(loss.item())
            agreements.append(agreement)
    per_depth = [round(sum(a) / len(a), 4) for a in zip(*agreements)]
    return round(sum(losses) / len(losses), 4), per_depth


def _save_checkpoint(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _resume(path: Path, identity: dict) -> dict | None:
    """The checkpoint in `path` when it continues this training; ValueError when it is of
    another one."""
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key, here in identity.items():
        there = state["identity"].get(key)
        if there == here:
            continue
        if isinstance(here, dict):
            diff = [f"{k} {there.get(k)!r} there, {v!r} here" for k, v in here.items()
                    if isinstance(there, dict) and there.get(k) != v] or [key]
        else:
            diff = [f"{key} differs"]
        raise ValueError(f"{path} is a checkpoint of another training ({'; '.join(diff)}): "
                         "run with its settings to continue it, or pass another --out "
                         f"(or delete {path.name} to start over)")
    return state


def train_drafter(model, data: list[str | Path], cfg: DrafterTraining,
                  out: str | Path | None = None, progress: bool = True,
                  stop_after: int | None = None) -> dict:
    """Train a drafter of cfg.kind for `model` on the text of `data` (files or directories);
    save it to `out` when given, checkpointing there on the way. `stop_after` ends the run
    after that many steps in all, leaving a checkpoint to continue from (record["finished"]
    is then False). Returns the record saved with the weights."""
    cfg = cfg.validate()
    files = data_files(data)
    stream = read_token_stream(model, files)
    split = int(len(stream) * (1 - cfg.held_out))
    train, held = stream[:split], stream[split:]
    if len(train) < cfg.seq_len or len(held) < cfg.seq_len:
        raise ValueError(f"the data has {len(stream)} tokens; need at least "
                         f"{math.ceil(cfg.seq_len / cfg.held_out)} for seq_len {cfg.seq_len}")
    torch.manual_seed(cfg.seed)
    module = objectives.build(cfg.kind, model, cfg, train)
    opt = torch.optim.AdamW(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    identity = {"settings": cfg.settings(), "model": store.fingerprint(model),
                "data": {"tokens": len(stream), "digest": stream_digest(stream)}}
    checkpoint = Path(out) / CHECKPOINT.format(kind=cfg.kind) if out is not None else None
    state = _resume(checkpoint, identity) if checkpoint is not None else None
    train_set = TargetFeatures(model, train, cfg.seq_len, progress, "target features (train)")
    held_set = TargetFeatures(model, held, cfg.seq_len, progress, "target features (held out)")
    if state is not None:
        module.load_state_dict(state["module"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        step, curve, before = state["step"], state["curve"], state["before"]
        seconds = state["seconds"]
    else:
        step, curve, seconds = 0, [], 0.0
        before = evaluate(module, model, held_set, cfg)

    def save_state() -> None:
        if checkpoint is not None:
            _save_checkpoint(checkpoint, {
                "identity": identity, "step": step, "curve": curve, "before": before,
                "seconds": seconds + time.time() - start, "module": module.state_dict(),
                "optimizer": opt.state_dict(), "generator": gen.get_state()})

    start = time.time()
    last = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    if checkpoint is not None:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
    loss_fn = objectives.LOSSES[cfg.kind]
    # an EAGLE drafter's targets come from the features; heads distill the full logits
    want_logits = cfg.kind == "heads" and cfg.target == "distill"
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {cfg.kind}", disable=not progress,
               dynamic_ncols=True)
    try:
        while step < last:
            for group in opt.param_groups:
                group["lr"] = warmup_cosine(step, cfg.steps, cfg.warmup_steps, cfg.lr)
            index = sample_windows(len(train_set), cfg.batch_size, gen)
            loss, _ = loss_fn(module, model, train_set.batch(index, want_logits), cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            opt.step()
            step += 1
            curve.append(round(loss.item(), 4))
            bar.set_postfix(loss=f"{curve[-1]:.3f}")
            bar.update(1)
            if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                save_state()
    except KeyboardInterrupt:
        save_state()
        raise
    finally:
        bar.close()
    if step < cfg.steps:
        save_state()
        return {"kind": cfg.kind, "finished": False, "steps_done": step, "loss_curve": curve}
    after = evaluate(module, model, held_set, cfg)
    record = {"kind": cfg.kind, "finished": True, "training": asdict(cfg),
              "held_out_loss_before": before[0], "held_out_loss_after": after[0],
              "agreement_before": before[1], "agreement_after": after[1],
              "seconds": round(seconds + time.time() - start, 1), "train_tokens": len(train),
              "held_out_tokens": len(held), "loss_curve": curve,
              "data": [str(f) for f in files]}
    if out is not None:
        module.save(Path(out), model, record)
        checkpoint.unlink(missing_ok=True)
    return record

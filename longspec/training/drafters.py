"""Train a drafter (EAGLE feature drafter or multi-token heads) on a frozen target.

The training text is cut into windows of `seq_len` tokens and the frozen target runs over
each once (its features, `target_features`, written in shards to `<out>/features-train/` and
`<out>/features-held/` as the pass goes, so an interrupted pass continues where it stopped;
`features_only` runs the pass alone); each step draws `batch_size` of those windows and takes
one AdamW step on the drafter's loss (training/objectives.py), its products in bfloat16 where the
hardware multiplies it natively (`training_precision`); linear warmup, then cosine decay.
Every `checkpoint_every` steps, and on Ctrl-C, the drafter, the optimizer and the data
sampler's state go to `<out>/<kind>.checkpoint.pt`: running the same training again continues
from there (without the features' pass) and ends with the weights an uninterrupted run gives; a
checkpoint of other settings, data or model is refused. At the end the drafter is saved with a
record of the run (held-out loss and agreement with the target before and after, an EAGLE
drafter's held-out acceptance per depth (`report`), loss curve, seconds, data) and the
checkpoint removed, and the features too unless asked to keep them.

The data is text files, or ShareGPT's conversations (`training_data`).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..heads import store
from ..heads.module import GAMMA
from ..models.compiled import cpu_isa
from ..sampling.logits import SamplingConfig
from . import objectives
from .data import (
    TargetFeatures,
    TokenStream,
    chat_stream,
    data_files,
    features_dirs,
    read_token_stream,
    sample_windows,
    target_features,
)
from .schedule import warmup_cosine

TARGETS = ("text", "distill")
# the drafter's products in training: bfloat16 under autocast (its weights, gradients and the
# optimizer stay float32) or float32; "auto" takes bfloat16 where the hardware multiplies it
# natively (TRAINING.md: 2.0x a step where the kernel profile is AVX512_BF16)
PRECISIONS = ("auto", "float32", "bfloat16")
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
    ttt_steps: int = 3            # eagle: steps unrolled over its own guesses in training
    draft_vocab: int = 0          # eagle: guess among this many most frequent tokens (0: all)
    eagle_mlp: int = 0            # eagle: its MLP's width (0: the target's)
    sharegpt: int = 0             # train on this many tokens of ShareGPT conversations
    answers: str = ""             # the model's answers to their questions, used in their place
    seed: int = 0
    held_out: float = 0.05        # share of the token stream kept for evaluation
    checkpoint_every: int = 50    # steps
    precision: str = "auto"       # PRECISIONS

    def validate(self) -> DrafterTraining:
        """Checked, with the learning rate filled in."""
        if self.kind not in store.KINDS:
            raise ValueError(f"kind must be one of {', '.join(store.KINDS)}, got {self.kind!r}")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got "
                             f"{self.precision!r}")
        for name in ("steps", "batch_size", "gamma", "checkpoint_every", "ttt_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.eagle_mlp < 0:
            raise ValueError(f"eagle_mlp must be 0 (the target's width) or more, got "
                             f"{self.eagle_mlp}")
        if self.draft_vocab < 0:
            raise ValueError(f"draft_vocab must be 0 (the whole vocabulary) or more, got "
                             f"{self.draft_vocab}")
        if self.sharegpt < 0:
            raise ValueError(f"sharegpt must be 0 (train on --data) or a number of tokens, got "
                             f"{self.sharegpt}")
        if self.answers and not self.sharegpt:
            raise ValueError("answers to ShareGPT's questions replace its conversations: give "
                             "--sharegpt TOKENS with --answers")
        shortest = max(self.gamma, self.ttt_steps) + 2
        if self.seq_len < shortest:
            raise ValueError(f"seq_len must be at least {shortest}")
        lr = LR[self.kind] if self.lr is None else self.lr
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive number, got {lr}")
        if not 0 < self.held_out < 1:
            raise ValueError(f"held_out must be between 0 and 1, got {self.held_out}")
        return replace(self, lr=lr)

    def settings(self) -> dict:
        """What a checkpoint must share to be continued (all but checkpoint_every, and the
        answers' directory: the data's digest says what they were). `train_drafter` puts the
        precision there as `training_precision` resolves it, so "auto" on another CPU
        continues only where it means the same."""
        return {k: v for k, v in asdict(self).items() if k not in ("checkpoint_every", "answers")}


def training_precision(precision: str, device: torch.device) -> str:
    """"bfloat16" or "float32": `precision`, with "auto" resolved for `device`: bfloat16 on a
    CPU with bfloat16 dot products (cpu_isa AMX or AVX512_BF16, as the kernel profile's
    switches leave it) or a CUDA device that has them, float32 elsewhere (where bfloat16
    products are emulated and slower)."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
    else:
        native = cpu_isa() in ("AMX", "AVX512_BF16")
    return "bfloat16" if native else "float32"


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


REPORT_SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9)


def report_depth() -> int:
    """The depth of the trees `auto` drafts with an EAGLE drafter."""
    from ..drafters.auto import EAGLE_BUDGET

    return EAGLE_BUDGET.max_depth


def report(eagle, model, held: TargetFeatures, depth: int, batch_size: int = 1) -> dict:
    """The honest metric of an EAGLE drafter: over every held-out window's answer tokens,
    its acceptance per depth (depth k given k-1 accepted) greedy, greedy with its 8 best
    guesses kept at each depth, and sampled (T=0.7, top-p 0.9, the target's Gumbel-max choice
    with noise both sides share), unrolled `depth` steps, and the mean tokens a step commits
    that each implies."""
    from ..drafters.eagle import TOP_K  # the children `eagle` gives a node

    net = model.net
    kinds = {"greedy": {}, f"greedy_top{TOP_K}": {"top": TOP_K},
             "sampled": {"sampling": REPORT_SAMPLING}}
    counts = {name: [[0, 0] for _ in range(depth)] for name in kinds}
    with torch.no_grad():
        for first in range(0, len(held), batch_size):
            batch = held.batch(torch.arange(first, min(first + batch_size, len(held))), True)
            features = eagle.target_feature(net, batch.hidden)
            embeds = F.embedding(batch.tokens, net.embed).float()
            head = eagle.head(net).float()
            logits = [F.linear(g, head) for g in eagle.unroll(embeds, features, depth)]
            for name, how in kinds.items():
                for k, r in enumerate(objectives.acceptance(eagle, batch, logits, seed=first,
                                                            **how)):
                    counts[name][k][0] += r["accepted"]
                    counts[name][k][1] += r["tried"]
    out: dict = {"depths": depth, "answer_tokens": int(held.answer.sum())}
    for name, per_depth in counts.items():
        rates = [round(a / n, 4) if n else 0.0 for a, n in per_depth]
        out[name] = rates
        out[f"{name}_mean_accepted"] = objectives.implied_length(rates)
    return out


def report_drafter(model, data: list[str | Path], cfg: DrafterTraining, path: str | Path,
                   progress: bool = True) -> dict:
    """`report` for the EAGLE drafter in `path`, on the held-out part of the data cfg names."""
    from ..heads.eagle import load_eagle

    cfg = cfg.validate()
    eagle = load_eagle(path, model).float()
    _, held, _ = training_data(model, data, cfg, progress)
    held_set = TargetFeatures(model, held, cfg.seq_len, progress, "target features (held out)")
    return report(eagle, model, held_set, report_depth())


@contextlib.contextmanager
def autocast(device: torch.device, precision: str):
    """The training step's products in `precision` (training_precision's)."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"), \
            warnings.catch_warnings():
        # bfloat16 activations against the norms' float32 weights: ATen's unfused norm, and
        # a warning per process that says so
        warnings.filterwarnings("ignore", "Mismatch dtype between input and weight")
        yield


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


def training_data(model, data: list[str | Path], cfg: DrafterTraining, progress: bool = False
                  ) -> tuple[TokenStream, TokenStream, list[str]]:
    """The training and held-out token streams, and what they were made from: cfg.sharegpt
    tokens of ShareGPT's training conversations and held_out as many of its held-out ones
    (`zoo/sharegpt.py` splits by conversation; those cfg.answers answers stand in for the
    conversations they answer), or the text of `data` (files or directories), its last
    held_out share held out."""
    if cfg.sharegpt:
        from ..models.sources import fetch_data
        from ..zoo import sharegpt
        from .answers import read_sharegpt_answers

        if data:
            raise ValueError("train on --data files or on ShareGPT (--sharegpt), not both")
        path = fetch_data("sharegpt")
        answers = read_sharegpt_answers(cfg.answers) if cfg.answers else {}

        def side(held: bool):
            return (answers.get(c.id, c.turns) for c in sharegpt.conversations(path)
                    if sharegpt.held_out(c) == held)

        train = chat_stream(model, side(False), cfg.sharegpt, progress, "ShareGPT (train)")
        held_tokens = max(cfg.seq_len, int(cfg.sharegpt * cfg.held_out))
        held = chat_stream(model, side(True), held_tokens, progress, "ShareGPT (held out)")
        source = [f"ShareGPT ({path.name}): {len(train)} training tokens, {len(held)} held out"
                  + (f"; the model's answers to {len(answers)} of its questions"
                     if answers else "")]
    else:
        files = data_files(data)
        stream = read_token_stream(model, files)
        train, held = stream.split(int(len(stream) * (1 - cfg.held_out)))
        source = [str(f) for f in files]
    if len(train) < cfg.seq_len or len(held) < cfg.seq_len:
        raise ValueError(f"the data has {len(train) + len(held)} tokens; need at least "
                         f"{math.ceil(cfg.seq_len / cfg.held_out)} for seq_len {cfg.seq_len}")
    return train, held, source


def features_only(model, data: list[str | Path], cfg: DrafterTraining, out: str | Path,
                  progress: bool = True) -> dict:
    """The target's features over cfg's data, written to `out` for the trainings that follow
    (of either kind, with the same data and seq_len): what the pass read and wrote."""
    cfg = cfg.validate()
    start = time.time()
    train, held, _ = training_data(model, data, cfg, progress)
    target_features(model, train, held, cfg.seq_len, out, progress)
    size = sum(f.stat().st_size for d in features_dirs(out).values() for f in d.iterdir())
    return {"windows": (len(train) // cfg.seq_len, len(held) // cfg.seq_len),
            "tokens": len(train) + len(held), "bytes": size,
            "seconds": round(time.time() - start, 1)}


def train_drafter(model, data: list[str | Path], cfg: DrafterTraining,
                  out: str | Path | None = None, progress: bool = True,
                  stop_after: int | None = None, keep_features: bool = False) -> dict:
    """Train a drafter of cfg.kind for `model` on the text of `data` (files or directories);
    save it to `out` when given, checkpointing there on the way. `stop_after` ends the run
    after that many steps in all, leaving a checkpoint to continue from (record["finished"]
    is then False). The target's features in `out` are removed at the end unless
    `keep_features`. Returns the record saved with the weights."""
    cfg = cfg.validate()
    train, held, source = training_data(model, data, cfg, progress)
    torch.manual_seed(cfg.seed)
    module = objectives.build(cfg.kind, model, cfg, train)
    opt = torch.optim.AdamW(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    precision = training_precision(cfg.precision, model.device)
    identity = {"settings": {**cfg.settings(), "precision": precision},
                "model": store.fingerprint(model),
                "data": {"tokens": len(train) + len(held),
                         "digest": train.digest() + held.digest()}}
    checkpoint = Path(out) / CHECKPOINT.format(kind=cfg.kind) if out is not None else None
    state = _resume(checkpoint, identity) if checkpoint is not None else None
    train_set, held_set = target_features(model, train, held, cfg.seq_len, out, progress)
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
            batch = train_set.batch(index, want_logits)
            with autocast(model.device, precision):
                loss, _ = loss_fn(module, model, batch, cfg)
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
    measured = {}
    if cfg.kind == "eagle":
        measured = {"held_out_acceptance": report(module, model, held_set, report_depth())}
    # (the answers' directory by its name: the record travels with the drafter)
    training = {**asdict(cfg), "answers": Path(cfg.answers).name, "precision": precision}
    record = {"kind": cfg.kind, "finished": True, "training": training, **measured,
              "held_out_loss_before": before[0], "held_out_loss_after": after[0],
              "agreement_before": before[1], "agreement_after": after[1],
              "seconds": round(seconds + time.time() - start, 1), "train_tokens": len(train),
              "held_out_tokens": len(held), "loss_curve": curve,
              "data": source}
    if out is not None:
        module.save(Path(out), model, record)
        checkpoint.unlink(missing_ok=True)
        if not keep_features:
            for path in features_dirs(out).values():
                shutil.rmtree(path, ignore_errors=True)
    return record

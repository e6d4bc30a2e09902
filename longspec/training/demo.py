"""Train the bundled demo models: a byte-level BPE tokenizer, a ~7.7M-parameter Llama target
with grouped-query attention and a ~1.4M-parameter Llama draft sharing its tokenizer.

Training uses transformers' `LlamaForCausalLM`, so the saved checkpoints are plain Hugging Face
checkpoints that both transformers and longspec's own backend load.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ..zoo.data import read_texts, stdlib_dir, stdlib_sources
from .schedule import warmup_cosine
from .tokenizer import train_tokenizer


@dataclass(frozen=True)
class DemoSpec:
    """Shape and schedule of one demo model."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    steps: int
    lr: float
    context: int = 2048          # training sequence length
    batch_size: int = 4          # sequences per step
    warmup_steps: int = 50
    weight_decay: float = 0.1
    extra: dict = field(default_factory=dict)


TARGET = DemoSpec("target", 256, 8, 8, 2, 704, steps=1200, lr=3e-3)
DRAFT = DemoSpec("draft", 128, 2, 4, 2, 384, steps=600, lr=3e-3)
VOCAB_SIZE = 8192
# Positions the demo models accept: far past the training context, so that long
# generations (100K+ tokens) are possible; RoPE extrapolates beyond what was trained.
MAX_POSITIONS = 131072


def tokenize_corpus(tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one stream of token ids, each document followed by EOS."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    stream = [t for doc in ids for t in (*doc, eos)]
    return torch.tensor(stream, dtype=torch.long)


def _batch(stream: torch.Tensor, spec: DemoSpec, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - spec.context - 1, (spec.batch_size,), generator=gen)
    return torch.stack([stream[s : s + spec.context] for s in starts.tolist()])


@torch.no_grad()
def _eval_loss(model, stream: torch.Tensor, spec: DemoSpec, batches: int = 4) -> float:
    gen = torch.Generator().manual_seed(1234)
    model.eval()
    losses = []
    for _ in range(batches):
        x = _batch(stream, spec, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return sum(losses) / len(losses)


def train_model(spec: DemoSpec, tokenizer, train: torch.Tensor, val: torch.Tensor,
                out_dir: Path, seed: int = 0) -> dict:
    """Train one model from scratch and save it (bf16 weights) with its tokenizer and a log."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, intermediate_size=spec.intermediate_size,
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr, betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(seed)
    log = []
    start = time.time()
    bar = tqdm(range(spec.steps), desc=f"train {spec.name}", dynamic_ncols=True)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = warmup_cosine(step, spec.steps, spec.warmup_steps, spec.lr, floor=0.1)
        x = _batch(train, spec, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % 50 == 0 or step == spec.steps - 1:
            entry = {"step": step, "train_loss": round(loss.item(), 4),
                     "seconds": round(time.time() - start, 1)}
            if step % 200 == 0 or step == spec.steps - 1:
                entry["val_loss"] = round(_eval_loss(model, val, spec), 4)
            log.append(entry)
    seconds = time.time() - start
    model.to(torch.bfloat16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    params = sum(p.numel() for p in model.parameters())
    record = {
        "spec": asdict(spec), "parameters": params, "train_tokens": len(train),
        "tokens_seen": spec.steps * spec.batch_size * spec.context,
        "seconds": round(seconds, 1), "final_val_loss": log[-1].get("val_loss"),
        "machine": f"{platform.processor() or platform.machine()}, "
                   f"{torch.get_num_threads()} threads",
        "torch": torch.__version__, "log": log,
    }
    (out_dir / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def build_demo_models(out_root: Path, target_steps: int | None = None,
                      draft_steps: int | None = None, seed: int = 0) -> dict:
    """Tokenizer, draft and target trained on the standard library's source, saved under
    `out_root/target` and `out_root/draft`. Returns the two training records."""
    from dataclasses import replace

    files = stdlib_sources()
    texts = read_texts(files)
    tok_dir = out_root / "tokenizer"
    tokenizer = train_tokenizer(texts, VOCAB_SIZE, tok_dir)
    stream = tokenize_corpus(tokenizer, texts)
    split = int(len(stream) * 0.99)
    train, val = stream[:split], stream[split:]
    print(f"data: {len(files)} files from {stdlib_dir()}, {len(stream)} tokens "
          f"({len(train)} train / {len(val)} held out)")
    records = {}
    for spec, steps in ((DRAFT, draft_steps), (TARGET, target_steps)):
        spec = replace(spec, steps=steps) if steps else spec
        out = out_root / spec.name
        out.mkdir(parents=True, exist_ok=True)
        records[spec.name] = train_model(spec, tokenizer, train, val, out, seed)
        print(f"{spec.name}: {records[spec.name]['parameters']} parameters, "
              f"{records[spec.name]['seconds']:.0f} s, "
              f"val loss {records[spec.name]['final_val_loss']}")
    shutil.rmtree(tok_dir)
    return records

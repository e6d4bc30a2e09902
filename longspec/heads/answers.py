"""Self-distillation data: the model's own chat answers to instructions, as training text.

A drafter learns best from the text it will draft for: the target's own answers, written
through its chat template. Each instruction becomes one file `answer-NNNN.txt` holding the
whole conversation as the model sees it (template, instruction, answer, end-of-turn, special
tokens as text), which `train-drafter --data DIR` reads back through the tokenizer. Files are
written atomically and an existing one is kept: an interrupted run continues where it stopped.
"""

from __future__ import annotations

import os
from pathlib import Path

from tqdm import tqdm

from ..text import read_text_file


def read_instructions(path: str | Path) -> list[str]:
    """One instruction per non-empty line of a text file."""
    lines = [line.strip() for line in read_text_file(path, "instructions file").splitlines()]
    instructions = [line for line in lines if line]
    if not instructions:
        raise ValueError(f"{path} holds no instructions (one per line)")
    return instructions


def write_answers(model, instructions: list[str], out: str | Path, *, max_new_tokens: int,
                  sampling, seed: int = 0, method: str = "auto", progress: bool = True
                  ) -> list[Path]:
    """Answer each instruction (seed + its index) and write the conversations to `out`;
    returns the files, the ones already there included."""
    from ..api import generate
    from ..request import encode_prompt

    if model.tokenizer is None:
        raise ValueError(f"{model.name} has no tokenizer: answers are written as text")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"answer-{i:04d}.txt" for i in range(len(instructions))]
    todo = [i for i, p in enumerate(paths) if not p.exists()]
    bar = tqdm(total=len(paths), initial=len(paths) - len(todo), desc="answers", unit="answer",
               disable=not progress, dynamic_ncols=True)
    try:
        for i in todo:
            ids = encode_prompt(model, [{"role": "user", "content": instructions[i]}])
            res = generate(model, ids, max_new_tokens=max_new_tokens, method=method,
                           sampling=sampling, seed=seed + i)
            text = model.tokenizer.decode(ids + res.token_ids, skip_special_tokens=False)
            tmp = paths[i].with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, paths[i])
            bar.update(1)
    finally:
        bar.close()
    return paths

"""Self-distillation data: the model's own chat answers to instructions, as training text.

A drafter learns best from the text it will draft for: the target's own answers, written
through its chat template. Each instruction becomes one file `answer-NNNN.txt` holding the
whole conversation as the model sees it (template, instruction, answer, end-of-turn, special
tokens as text), which `train-drafter --data DIR` reads back through the tokenizer.

The model's answers to ShareGPT's questions (the first turn of each conversation) are kept as
conversations instead, one `sharegpt-NNNNN.json` each ({"id", "turns"}: the question and the
answer, as ShareGPT writes a conversation), which `train-drafter --sharegpt TOKENS --answers
DIR` trains on in place of the conversations they answer: through the chat template, answer
tokens marked, split by conversation as ShareGPT is.

Files are written atomically and an existing one is kept: an interrupted run continues where it
stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from ..outputs.text import read_text_file


def read_instructions(path: str | Path) -> list[str]:
    """One instruction per non-empty line of a text file."""
    lines = [line.strip() for line in read_text_file(path, "instructions file").splitlines()]
    instructions = [line for line in lines if line]
    if not instructions:
        raise ValueError(f"{path} holds no instructions (one per line)")
    return instructions


class Job(NamedTuple):
    path: Path             # where the conversation goes
    instruction: str
    seed: int
    key: str = ""          # the ShareGPT conversation answered


def write_answers(model, instructions: list[str], out: str | Path, *, max_new_tokens: int,
                  sampling, seed: int = 0, method: str = "auto", progress: bool = True
                  ) -> list[Path]:
    """Answer each instruction (seed + its index) and write the conversations to `out`;
    returns the files, the ones already there included."""
    def conversation(_: Job, ids: list[int], new: list[int]) -> str:
        return model.tokenizer.decode(ids + new, skip_special_tokens=False)

    jobs = [Job(Path(out) / f"answer-{i:04d}.txt", ask, seed + i)
            for i, ask in enumerate(instructions)]
    return _answer_each(model, jobs, conversation, max_new_tokens=max_new_tokens,
                        sampling=sampling, method=method, progress=progress)


MAX_QUESTION_CHARS = 4000    # longer first turns (pasted documents, mostly) are not asked


def sharegpt_questions(path: str | Path, count: int) -> list[tuple[int, str, str]]:
    """(index, id, question) of the first `count` ShareGPT conversations (by their index in
    the file) that open with a question of at most MAX_QUESTION_CHARS characters."""
    from ..zoo import sharegpt

    asked = []
    for index, c in enumerate(sharegpt.conversations(path)):
        if len(asked) == count:
            break
        if c.turns and c.turns[0][0] == "human" and 0 < len(c.turns[0][1].strip()) \
                <= MAX_QUESTION_CHARS:
            asked.append((index, c.id, c.turns[0][1]))
    return asked


def write_sharegpt_answers(model, count: int, out: str | Path, *, max_new_tokens: int,
                           sampling, seed: int = 0, method: str = "auto",
                           progress: bool = True) -> list[Path]:
    """Answer the questions of `sharegpt_questions` (seed + the conversation's index) and
    write each as a conversation to `out`; returns the files, the ones already there
    included."""
    from ..models.sources import fetch_data

    def conversation(job: Job, _: list[int], new: list[int]) -> str:
        answer = model.tokenizer.decode(new, skip_special_tokens=True)
        return json.dumps({"id": job.key, "turns": [["human", job.instruction], ["gpt", answer]]},
                          ensure_ascii=False)

    jobs = [Job(Path(out) / f"sharegpt-{index:05d}.json", question, seed + index, cid)
            for index, cid, question in sharegpt_questions(fetch_data("sharegpt"), count)]
    return _answer_each(model, jobs, conversation, max_new_tokens=max_new_tokens,
                        sampling=sampling, method=method, progress=progress)


def read_sharegpt_answers(path: str | Path) -> dict[str, list[tuple[str, str]]]:
    """The conversations `write_sharegpt_answers` wrote to `path`, by ShareGPT id."""
    files = sorted(Path(path).glob("sharegpt-*.json")) if Path(path).is_dir() else []
    if not files:
        raise ValueError(f"{path} holds no answers to ShareGPT's questions (sharegpt-*.json: "
                         "write them with `longspec answers MODEL --sharegpt COUNT --out DIR`)")
    answers = {}
    for f in files:
        record = json.loads(read_text_file(f, "answers file"))
        answers[record["id"]] = [(who, text) for who, text in record["turns"]]
    return answers


def _answer_each(model, jobs: list[Job], conversation, *, max_new_tokens: int, sampling,
                 method: str, progress: bool) -> list[Path]:
    """Answer each job whose file is not there yet, writing conversation(job, prompt ids,
    answer ids) to its file."""
    from ..api import generate
    from ..request import encode_prompt

    if model.tokenizer is None:
        raise ValueError(f"{model.name} has no tokenizer: answers are written as text")
    if jobs:
        jobs[0].path.parent.mkdir(parents=True, exist_ok=True)
    todo = [job for job in jobs if not job.path.exists()]
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="answers", unit="answer",
               disable=not progress, dynamic_ncols=True)
    try:
        for job in todo:
            ids = encode_prompt(model, [{"role": "user", "content": job.instruction}])
            res = generate(model, ids, max_new_tokens=max_new_tokens, method=method,
                           sampling=sampling, seed=job.seed)
            tmp = job.path.with_suffix(".tmp")
            tmp.write_text(conversation(job, ids, res.token_ids), encoding="utf-8")
            os.replace(tmp, job.path)
            bar.update(1)
    finally:
        bar.close()
    return [job.path for job in jobs]

"""How many CUDA graphs a batch would capture, counted on any machine: `generate_many` runs here
(on a CPU nothing is captured), every batch step's combination of buckets is recorded (the
members' bucket for their trees, whether every tree is the root alone, the fewest tokens a
member has left), and the steps are then replayed through graphs.py's rule (`Captures.due`,
with a capture costing --runs eager runs, and BATCH_GRAPHS combinations kept) and through the
rule before it (a combination captured at its second run). Both give eager runs, captures and
replays per method and max_batch; a GPU's seconds are those counts times its eager, capture
and replay costs (benchmarks/batch_sizes.py on the card reports its captures).

The trees here are sized by this machine's step costs; a GPU's sizer picks its own, so the
counts say how often memberships and drafting tries make combinations, not a card's figures.

    python benchmarks/capture_counts.py --model smollm2 --prompts 8 --new-tokens 256 \\
        --batches 4,8 --temperatures 0.7,1.0 --runs 5,10
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from pathlib import Path

from chat_bench import PROMPTS

import longspec
from longspec import batching
from longspec.models.captures import Captures, EagerRuns
from longspec.models.graphs import BATCH_GRAPHS, bucket_rows


def record_steps(model, prompts, method: str, max_batch: int, settings: dict) -> list[tuple]:
    """Each batch step's (combination, plain, fewest tokens left) over one generate_many."""
    steps = []
    forward = batching.Batch._forward

    def recorded(batch, engines, trees):
        steps.append((tuple(sorted((id(e), bucket_rows(t.n)) for e, t in zip(engines, trees))),
                      all(t.n == 1 for t in trees),
                      min(e.max_new_tokens - e.stats.new_tokens for e in engines)))
        return forward(batch, engines, trees)

    batching.Batch._forward = recorded
    try:
        longspec.generate_many(model, prompts, max_batch=max_batch, method=method, **settings)
    finally:
        batching.Batch._forward = forward
    return steps


def replay(steps: list[tuple], runs: float | None) -> tuple[int, int, int]:
    """(eager runs, captures, replays) of the steps: under Captures.due with a capture costing
    `runs` eager runs, or (None) captured at the second run."""
    captures = Captures()
    if runs is not None:
        captures.runs = runs
    kept: OrderedDict[tuple, list] = OrderedDict()      # combination -> [EagerRuns, captured]
    eager = captured = replayed = 0
    for key, plain, left in steps:
        entry = kept.get(key)
        if entry is None:
            entry = kept[key] = [EagerRuns(), False]
            while len(kept) > BATCH_GRAPHS:
                kept.popitem(last=False)
        else:
            kept.move_to_end(key)
        ran = entry[0]
        due = ran.runs >= 1 if runs is None else captures.due(ran, left if plain else None)
        if not entry[1] and due:
            entry[1] = True
            captured += 1
        if entry[1]:
            replayed += 1
        else:
            ran.timed(lambda: None)
            eager += 1
    return eager, captured, replayed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--methods", default="ar,auto")
    p.add_argument("--batches", default="4,8")
    p.add_argument("--temperatures", default="0.7,1.0")
    p.add_argument("--runs", default="5,10", help="a capture's cost in eager runs, each")
    p.add_argument("--out")
    args = p.parse_args()
    model = longspec.load_model(args.model)
    prompts = [[{"role": "user", "content": text}] for text in PROMPTS[:args.prompts]]
    rows = []
    for temperature in map(float, args.temperatures.split(",")):
        settings = {"max_new_tokens": args.new_tokens, "ignore_eos": True, "seed": 0,
                    "sampling": longspec.SamplingConfig(temperature=temperature, top_p=0.9)}
        for max_batch in map(int, args.batches.split(",")):
            for method in args.methods.split(","):
                model.state.forget_text()
                steps = record_steps(model, prompts, method, max_batch, settings)
                row = {"temperature": temperature, "max_batch": max_batch, "method": method,
                       "steps": len(steps), "steps_with_a_tree": sum(not s[1] for s in steps),
                       "combinations": len({s[0] for s in steps}),
                       "before_eager_captures_replays": replay(steps, None)}
                for runs in map(float, args.runs.split(",")):
                    row[f"runs_{runs:g}_eager_captures_replays"] = replay(steps, runs)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()

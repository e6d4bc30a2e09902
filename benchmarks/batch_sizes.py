"""What --max-batch buys: generate_many over one set of chat prompts at several batch sizes.

`generate_many` over one set of chat prompts at several batch sizes, in one process: what
--max-batch buys, and where it stops buying.

Each row runs every prompt (chat_bench.py's, or with --sharegpt the first questions of ShareGPT's
held-out conversations; one seed each, --new-tokens tokens, end-of-sequence ignored unless
--respect-eos) with one method at one max_batch; max_batch 1 is the prompts one at a time. A row
gives the aggregate tokens/s (all new tokens over the wall time of the set: the median of
--repeats runs, interleaved so that drift hits every row alike), the median over the repeats of
its run over the first method's at the same max_batch (run beside it, before it in one repeat
and after it in the next) with those ratios' quartiles, and whether every prompt got the
tokens it gets at max_batch 1; the set's answers give where each reached end-of-sequence and
their distinct-4 (the same text in every row). Where more prompts than max_batch wait, a
generation joins as another ends (continuous batching). Each run starts from a cleared model
state, so it times its step costs cold; with --warm-costs each row first runs once untimed and
the timed runs forget only what was learned of the text (`SharedState.forget_text`: a server's
state after its first requests, without their outputs to copy).

    python benchmarks/batch_sizes.py --model smollm2 --prompts 8 --new-tokens 256 \\
        --methods ar,auto --batches 1,2,4,8 --out batch_sizes.json

On a GPU (--device cuda --dtype bfloat16) a run's wall time ends with its device's work: every
step reads its tokens back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from chat_bench import PROMPTS, sharegpt_prompts

import longspec
from longspec.bench.metrics import answer_end, distinct_n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--device", default="auto", help="cpu, cuda (where a batch's steps are "
                   "captured together: models/graphs.py) or auto (load_model's choice)")
    p.add_argument("--dtype", default="auto", help="the model's dtype (load_model's)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--methods", default="ar,auto")
    p.add_argument("--batches", default="1,2,4,8")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--sharegpt", action="store_true", help="prompts from ShareGPT's held-out "
                   "conversations")
    p.add_argument("--respect-eos", action="store_true", help="end each answer at its "
                   "end-of-sequence")
    p.add_argument("--repeats", type=int, default=1, help="runs per row (median reported)")
    p.add_argument("--warm-costs", action="store_true", help="step costs timed in an untimed "
                   "first run of each row, kept for the timed ones")
    p.add_argument("--out")
    args = p.parse_args()
    model = longspec.load_model(args.model, device=args.device, dtype=args.dtype)
    texts = sharegpt_prompts(args.prompts) if args.sharegpt else PROMPTS[:args.prompts]
    prompts = [[{"role": "user", "content": text}] for text in texts]
    settings = {"max_new_tokens": args.new_tokens, "ignore_eos": not args.respect_eos,
                "seed": 0, "sampling": longspec.SamplingConfig(temperature=args.temperature,
                                                               top_p=args.top_p)}
    rows = compare(model, prompts, settings, args.methods.split(","),
                   [int(b) for b in args.batches.split(",")], args.repeats, args.warm_costs)
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=1))


def compare(model, prompts: list, settings: dict, methods: list[str], batches: list[int],
            repeats: int, warm_costs: bool) -> list[dict]:
    """The table's rows (see the module's docstring): every prompt through generate_many with
    `settings`, for each method at each max_batch, `repeats` times; with `warm_costs`, each
    row first runs once untimed."""
    longspec.generate(model, prompts[0], max_new_tokens=16)         # warm-up
    # a max_batch's methods back to back, so that a ratio of one repeat's runs is of runs
    # seconds apart (the machine's speed drifts by up to 25% over minutes)
    keys = [(method, b) for b in batches for method in methods]
    runs: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
    # the CUDA graphs each run captured, and their seconds (state/captures.py)
    captured: dict[tuple[str, int], list[tuple[int, float]]] = {key: [] for key in keys}
    ids: dict[tuple[str, int], list[list[int]]] = {}
    same = dict.fromkeys(keys, True)        # every run of the row gave the same tokens
    model.state.clear()
    if warm_costs:
        for key in keys:
            longspec.generate_many(model, prompts, max_batch=key[1], method=key[0], **settings)
    for repeat in range(repeats):
        # a max_batch's methods in turn, their order reversed every other repeat, so that a
        # drift within a repeat favours no method
        for key in (keys if repeat % 2 == 0 else _reversed_within(keys, len(methods))):
            if warm_costs:
                model.state.forget_text()
            else:
                model.state.clear()      # every run starts as cold as the first
            taken, spent = model.state.captures.taken, model.state.captures.spent_s
            begin = time.perf_counter()
            results = longspec.generate_many(model, prompts, max_batch=key[1], method=key[0],
                                             **settings)
            seconds = time.perf_counter() - begin
            got = [r.token_ids for r in results]
            same[key] = same[key] and ids.setdefault(key, got) == got
            runs[key].append(sum(len(t) for t in got) / seconds)
            captured[key].append((model.state.captures.taken - taken,
                                  round(model.state.captures.spent_s - spent, 3)))
    rows = []
    for key in keys:
        got, rates = ids[key], runs[key]
        ratios = [r / first for r, first in zip(rates, runs[methods[0], key[1]])]
        rows.append({"method": key[0], "max_batch": key[1],
                     "new_tokens": sum(len(t) for t in got),
                     "tokens_per_s": round(statistics.median(rates), 1),
                     "runs_tokens_per_s": [round(r, 1) for r in rates],
                     f"over_{methods[0]}": round(statistics.median(ratios), 3),
                     f"over_{methods[0]}_quartiles": [round(q, 3) for q in _quartiles(ratios)],
                     "identical_to_one_at_a_time": same[key] and got == ids[key[0], batches[0]],
                     "runs_captures_and_seconds": captured[key],
                     "answer_end": [answer_end(t, set(model.eos_token_ids)) for t in got],
                     "distinct4": [round(distinct_n(t, 4), 2) for t in got]})
    return rows


def _quartiles(xs: list[float]) -> tuple[float, float]:
    """The first and third quartiles of `xs` (both the value itself when there is one)."""
    if len(xs) < 2:
        return xs[0], xs[0]
    first, _, third = statistics.quantiles(xs, n=4, method="inclusive")
    return first, third


def _reversed_within(keys: list, group: int) -> list:
    """`keys` with each run of `group` (one max_batch's methods) in reverse order."""
    return [key for i in range(0, len(keys), group) for key in reversed(keys[i:i + group])]


if __name__ == "__main__":
    main()

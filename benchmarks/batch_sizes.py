"""`generate_many` over one set of chat prompts at several batch sizes, in one process: what
--max-batch buys, and where it stops buying.

Each row runs every prompt (chat_bench.py's, one seed each, --new-tokens tokens, end-of-sequence
ignored) with one method at one max_batch; max_batch 1 is the prompts one at a time. A row gives
the aggregate tokens/s (all new tokens over the wall time of the set) and whether every prompt
got the tokens it gets at max_batch 1; the set's answers give where each reached
end-of-sequence and their distinct-4 (the same text in every row).

    python benchmarks/batch_sizes.py --model smollm2 --prompts 8 --new-tokens 256 \\
        --methods ar,auto --batches 1,2,4,8 --out batch_sizes.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from chat_bench import PROMPTS

import longspec
from longspec.bench.metrics import answer_end, distinct_n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--methods", default="ar,auto")
    p.add_argument("--batches", default="1,2,4,8")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--out")
    args = p.parse_args()
    model = longspec.load_model(args.model)
    prompts = [[{"role": "user", "content": text}] for text in PROMPTS[:args.prompts]]
    settings = {"max_new_tokens": args.new_tokens, "ignore_eos": True, "seed": 0,
                "sampling": longspec.SamplingConfig(temperature=args.temperature,
                                                    top_p=args.top_p)}
    longspec.generate(model, prompts[0], max_new_tokens=16)         # warm-up
    rows, alone = [], {}
    for method in args.methods.split(","):
        for max_batch in (int(b) for b in args.batches.split(",")):
            model.state.clear()      # every row starts as cold as the first
            begin = time.perf_counter()
            results = longspec.generate_many(model, prompts, max_batch=max_batch,
                                             method=method, **settings)
            seconds = time.perf_counter() - begin
            ids = [r.token_ids for r in results]
            alone.setdefault(method, ids)
            tokens = sum(len(t) for t in ids)
            rows.append({"method": method, "max_batch": max_batch, "seconds": round(seconds, 2),
                         "new_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
                         "identical_to_one_at_a_time": ids == alone[method],
                         "answer_end": [answer_end(t, set(model.eos_token_ids)) for t in ids],
                         "distinct4": [round(distinct_n(t, 4), 2) for t in ids]})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()

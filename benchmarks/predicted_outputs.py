"""Predicted outputs: a module returned with a function renamed, `ar` against `auto`.

Predicted outputs: a standard-library module returned with a small edit (a function renamed
everywhere), greedy, end-of-sequence respected, decoded by `ar`, `auto`, and `auto` with the
original module as the prediction (OpenAI's predicted outputs), in one process with the model's
learned state cleared before every run. Each row: tokens/s over the decode, the ratio to `ar`,
tokens a step, where the answer ended, its distinct-4, whether it is `ar`'s tokens, and the
prediction's accepted and rejected tokens as the usage reports them.

    python benchmarks/predicted_outputs.py --model qwen-coder-1.5b --modules colorsys,fnmatch
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json

import longspec
from longspec.bench.metrics import answer_end, distinct_n
from longspec.request import encode_prompt

# module -> (a function of it, its new name)
RENAMES = {"colorsys": ("rgb_to_hls", "rgb_to_hue_lightness_saturation"),
           "fnmatch": ("translate", "pattern_to_regex"),
           "textwrap": ("dedent", "remove_common_indent")}


def edit_prompt(module: str, source: str) -> str:
    old, new = RENAMES[module]
    return (f"Rename the function `{old}` to `{new}` everywhere in this module (its definition "
            "and every call). Return the whole module, nothing else.\n\n"
            f"```python\n{source}```")


def run(model, prompt: list[int], method: str, n: int, prediction: str | None) -> dict:
    model.state.clear()
    res = longspec.generate(model, prompt, max_new_tokens=n, method=method,
                            sampling=longspec.SamplingConfig(temperature=0),
                            prediction=prediction)
    s = res.stats
    return {"tokens": res.token_ids, "tok_s": s["tokens_per_s"],
            "tokens_a_step": round(s["mean_accepted_length"], 2),
            "prediction": s.get("prediction")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen-coder-1.5b")
    p.add_argument("--modules", default="colorsys,fnmatch",
                   help=f"comma-separated, of {', '.join(RENAMES)}")
    p.add_argument("--max-new-tokens", type=int, default=3000)
    p.add_argument("--out", help="write the rows as JSON here too")
    args = p.parse_args()
    model = longspec.load_model(args.model)
    print(f"kernel profile: {model.profile.describe() if model.profile else 'none'}", flush=True)
    rows = []
    for module in args.modules.split(","):
        source = inspect.getsource(importlib.import_module(module))
        prompt = encode_prompt(model, [{"role": "user", "content": edit_prompt(module, source)}])
        runs = {"ar": run(model, prompt, "ar", args.max_new_tokens, None),
                "auto": run(model, prompt, "auto", args.max_new_tokens, None),
                "auto, prediction": run(model, prompt, "auto", args.max_new_tokens, source)}
        ref = runs["ar"]["tokens"]
        for name, r in runs.items():
            row = {"module": module, "decoder": name, "tokens": len(r["tokens"]),
                   "answer_end": answer_end(r["tokens"], model.eos_token_ids),
                   "distinct_4": round(distinct_n(r["tokens"], 4), 2),
                   "tok_s": round(r["tok_s"], 1),
                   "over_ar": round(r["tok_s"] / runs["ar"]["tok_s"], 2),
                   "tokens_a_step": r["tokens_a_step"], "identical": r["tokens"] == ref,
                   "prediction": r["prediction"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""The device check: exactness, speed and step costs on a GPU, in one call of a short lease.

The device check: what a GPU lease runs, in one call, writing its JSON to --out after every
run so that a lease cut short still returns what ran. A GPU lease is short (minutes): stage the
model first (gpu_stage.py), then run this once; --budget-s stops starting runs when the time is
spent (the runs not started are listed as skipped).

  (a) exactness: every method against `ar`, greedy and sampled (TokenSwift's setting),
      bfloat16 and float32, with the attention path the GPU takes (tree_attention.py's kernel
      where Triton is); `draft` and `triforce` with --draft-model, `eagle` with --heads (by
      default the demo's small model, and SmolLM2's EAGLE drafter in training/drafters); each
      method's prompt from the prompt cache (`ar`'s run left it there), and a next turn (the
      prompt, `ar`'s answer and more) from the cache against the cache cleared;
  (b) speed on the real model: `ar`, `auto` and transformers' `generate` with a static cache,
      compiled (the strong peer on a GPU), on chat answers (end-of-sequence respected) and in
      TokenSwift's setting (EOS ignored): tokens/s, where the answer ended, distinct-4, and
      whether each is token-identical to `ar`;
  (c) step costs with random weights (step_costs.py) at the Qwen2.5-1.5B and Llama-3.1-8B
      shapes, for 1, 16 and 64 rows at 8K, 32K and 100K cached positions, on each attention
      path (the Triton kernel with the step captured as a CUDA graph per bucket, the time of
      the first step, a capture's, given; the kernel eager; the products), beside the floor
      (every weight and the cache's keys and values read once at the card's measured read
      bandwidth). Milliseconds only: random weights give no speedups;
  (d) the tokens/s those step costs give at the longest context with the tokens a step
      measured on a CPU with real weights for trees of each row count (--acceptance), labelled
      projected;
  (e) many generations at once: `ar` and `auto` through generate_many at max_batch 1, 4 and 8
      on chat_bench's 8 prompts (T=0.7, top-p 0.9, end-of-sequence ignored), step costs warm
      (batch_sizes.py's table): tokens/s, `auto` over `ar`, each run's CUDA graph captures
      and their seconds, and whether every prompt got its tokens of max_batch 1.

On the card (after gpu_stage.py join), the kernel's tests there first (bitwise rows in
bfloat16 and float32, the steps captured; a minute), then the check:

    export PYTHONPATH=.:/tmp/site LONGSPEC_TEST_DEVICE=cuda
    python -m pytest -q -m "slow or not slow" tests/test_tree_attention.py 2>&1 \\
        | tee $OUT/kernel_tests.log
    python benchmarks/gpu_check.py --model .stage/smollm2.gguf --out $OUT/gpu_check.json \\
        --budget-s 420

Here, on a CPU, at tiny shapes, the kernel under Triton's interpreter (the slow tier runs
this, so it cannot break unseen):

    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
from batch_sizes import compare
from chat_bench import PROMPTS
from long_bench import SETTINGS as LONG_SETTINGS
from step_costs import (
    ACCEPTANCE,
    DRY_ROWS,
    DRY_SHAPES,
    ROWS,
    SHAPES,
    projected,
    step_costs,
    sync,
)

import longspec
from longspec.bench.metrics import answer_end, distinct_n
from longspec.drafters import METHODS
from longspec.models.graphs import graphs_wanted
from longspec.request import encode_prompt

SETTINGS = {name: LONG_SETTINGS[name] for name in ("greedy", "tokenswift")}
# what the methods of (a) that need more than the model are given (--draft-model, --heads)
NEEDS = {"draft": ("draft_model",), "triforce": ("draft_model",), "eagle": ("heads",)}
# the default drafts where the check's model has them: the demo's small model, and the EAGLE
# drafter trained for SmolLM2 (training/drafters, not bundled)
DRAFT_MODELS = {"demo": "demo-draft"}
EAGLE_DRAFTERS = {"smollm2": "training/drafters/smollm2-eagle"}
HF_WARM_UP_S = 90     # transformers' warm-up run: its compilation, then a few tokens


class Report:
    """The check's JSON, written whole after every entry, and the time left: `skipped` lists
    what the budget left out, `not_run` the methods that need what the model lacks, `errors`
    the parts that failed (the others still run)."""

    def __init__(self, path: Path, budget_s: float, meta: dict):
        self.path = path
        self.deadline = time.monotonic() + budget_s
        self.data = {"meta": meta, "exactness": [], "prompt_cache": [], "speed": [],
                     "step_costs": [], "projected": [], "batches": [], "skipped": [],
                     "not_run": {}, "errors": []}
        self.write()

    def time_left(self, what: str) -> bool:
        if time.monotonic() < self.deadline:
            return True
        self.data["skipped"].append(what)
        self.write()
        return False

    def failed(self, part: str, error: Exception) -> None:
        self.data["errors"].append({"part": part, "error": repr(error),
                                    "traceback": traceback.format_exc()[-3000:]})
        print(f"part {part} failed: {error!r}", file=sys.stderr, flush=True)
        self.write()

    def add(self, part: str, entry: dict) -> None:
        self.data[part].append(entry)
        print(json.dumps({"part": part, **entry}), flush=True)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def timed_generate(model, prompt, **kwargs) -> tuple[list[int], dict, float]:
    """Tokens, stats and wall seconds of one generation (the device synchronised)."""
    sync(model.device)
    begin = time.perf_counter()
    res = longspec.generate(model, prompt, **kwargs)
    sync(model.device)
    return res.token_ids, res.stats, time.perf_counter() - begin


def chat_prompt(model, text: str) -> list[int]:
    """The text as a user's turn through the chat template (as text where the model has
    none: the demo model of the dry run)."""
    if getattr(model.tokenizer, "chat_template", None):
        return encode_prompt(model, [{"role": "user", "content": text}])
    return encode_prompt(model, text)


def exactness(report: Report, path: str, device: str, tokens: int, draft: str | None,
              heads: str | None) -> None:
    for dtype in ("bfloat16", "float32"):
        model = longspec.load_model(path, device=device, dtype=dtype)
        helpers = {"heads": heads}
        if draft is not None:
            helpers["draft_model"] = longspec.load_model(draft, device=device, dtype=dtype)
        prompt = chat_prompt(model, PROMPTS[0])
        for setting, sampling in SETTINGS.items():
            common = {"max_new_tokens": tokens, "sampling": sampling, "seed": 3,
                      "ignore_eos": True}
            expect, _, _ = timed_generate(model, prompt, method="ar", **common)
            for method in METHODS:
                if method == "ar" or not report.time_left(f"exactness {dtype} {setting} {method}"):
                    continue
                extra = {k: v for k, v in helpers.items()
                         if v is not None and k in NEEDS.get(method, ())}
                try:
                    got, stats, seconds = timed_generate(model, prompt, method=method, **common,
                                                         **extra)
                except ValueError as e:     # it needs a draft model, or a drafter not bundled
                    report.data["not_run"][method] = str(e)
                    continue
                except Exception as e:  # noqa: BLE001 - one method's failure, the matrix goes on
                    report.failed(f"a: {dtype} {setting} {method}", e)
                    continue
                first = next((i for i, (a, b) in enumerate(zip(got, expect)) if a != b), None)
                report.add("exactness", {
                    "dtype": dtype, "setting": setting, "method": method,
                    "identical": got == expect, "first_difference": first,
                    "attention": model.profile.attention, "row_check": model.profile.row_check,
                    "graphs": graphs_wanted(model.net),
                    "tokens": len(got), "tokens_a_step": stats["mean_accepted_length"],
                    "seconds": round(seconds, 2)})
            if report.time_left(f"prompt cache {dtype} {setting}"):
                next_turn(report, model, prompt + expect + prompt[:8], common, dtype, setting)


def next_turn(report: Report, model, follow: list[int], common: dict, dtype: str,
              setting: str) -> None:
    """`auto` on a prompt holding the reference's prompt and answer: with the prompt cache
    holding them (its answer's keys written by plain steps), against the cache cleared."""
    hit, stats, _ = timed_generate(model, follow, method="auto", **common)
    model.state.prompt_cache.clear()
    fresh, fresh_stats, _ = timed_generate(model, follow, method="auto", **common)
    report.add("prompt_cache", {"dtype": dtype, "setting": setting,
                                "cached_tokens": stats["cached_tokens"],
                                "fresh_cached_tokens": fresh_stats["cached_tokens"],
                                "identical": hit == fresh})


def hf_generate(model):
    """transformers' model of the same checkpoint with a static cache, whose decoding step
    `generate` compiles on a GPU -> generate(prompt, n, sampling, eos, max_time) -> ids."""
    from transformers import AutoModelForCausalLM

    where, extra = model.transformers_location
    hf = AutoModelForCausalLM.from_pretrained(where, dtype=model.dtype, **extra)
    hf = hf.to(model.device).eval()
    hf.generation_config.cache_implementation = "static"

    def generate(prompt: list[int], n: int, sampling, eos: bool,
                 max_time: float | None = None) -> list[int]:
        kwargs = {"max_new_tokens": n, "pad_token_id": 0, "max_time": max_time}
        if not eos:
            kwargs["min_new_tokens"] = n
        if sampling.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=0, top_p=1.0,
                          min_p=sampling.min_p or None, repetition_penalty=sampling.penalty)
        ids = torch.tensor([prompt], device=model.device)
        torch.manual_seed(3)
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        return out[0, len(prompt):].tolist()

    return generate


def speed(report: Report, path: str, device: str, chat_tokens: int, long_tokens: int,
          decoders: list[str]) -> None:
    model = longspec.load_model(path, device=device, dtype="bfloat16")
    eos = model.eos_token_ids
    runs = [(f"chat {i}", PROMPTS[i], "greedy", chat_tokens, False) for i in range(2)]
    runs.append(("tokenswift", PROMPTS[1], "tokenswift", long_tokens, True))
    peer = hf_generate(model) if "hf" in decoders else None
    for name, text, setting, n, ignore_eos in runs:
        prompt = chat_prompt(model, text)
        sampling = SETTINGS[setting]
        timed_generate(model, prompt, method="ar", max_new_tokens=16, sampling=sampling)  # warm
        expect = None
        for decoder in decoders:
            if not report.time_left(f"speed {name} {decoder}"):
                return
            model.state.clear()
            if decoder == "hf":
                # compiles at this length (the static cache's), then stops
                peer(prompt, n, sampling, not ignore_eos, max_time=HF_WARM_UP_S)
                sync(model.device)
                begin = time.perf_counter()
                got, stats = peer(prompt, n, sampling, not ignore_eos), {}
                sync(model.device)
                seconds = time.perf_counter() - begin
            else:
                got, stats, seconds = timed_generate(
                    model, prompt, method=decoder, max_new_tokens=n, sampling=sampling, seed=3,
                    ignore_eos=ignore_eos)
            expect = got if decoder == "ar" else expect
            report.add("speed", {
                "run": name, "setting": setting, "decoder": decoder, "tokens": len(got),
                "tokens_per_s": round(len(got) / seconds, 1),
                "answer_end": answer_end(got, eos), "distinct_4": round(distinct_n(got, 4), 3),
                "identical_to_ar": None if expect is None else got == expect,
                "tokens_a_step": stats.get("mean_accepted_length")})


def batches(report: Report, path: str, device: str, tokens: int, repeats: int) -> None:
    if not report.time_left("batches"):
        return
    model = longspec.load_model(path, device=device, dtype="bfloat16")
    prompts = [chat_prompt(model, text) for text in PROMPTS[:8]]
    settings = {"max_new_tokens": tokens, "ignore_eos": True, "seed": 0,
                "sampling": longspec.SamplingConfig(temperature=0.7, top_p=0.9)}
    for row in compare(model, prompts, settings, ["ar", "auto"], [1, 4, 8], repeats,
                       warm_costs=True):
        report.add("batches", row)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="the real model of (a) and (b) (smollm2; the dry run's: demo)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=420, help="start no run after this")
    p.add_argument("--parts", default="a,b,c,d,e", help="which parts, in this order")
    p.add_argument("--exact-tokens", type=int, default=256)
    p.add_argument("--draft-model", help="the draft model of (a)'s draft and triforce "
                   "(default: demo-draft for the demo model, else none: those not run)")
    p.add_argument("--heads", help="the EAGLE drafter of (a)'s eagle (default for SmolLM2, "
                   "its GGUF named smollm2.gguf too: training/drafters/smollm2-eagle)")
    p.add_argument("--decoders", default="ar,auto,hf", help="the decoders (b) times, of "
                   "ar, auto and hf (transformers' compiled generate: its compilation takes "
                   "a minute or more)")
    p.add_argument("--chat-tokens", type=int, default=1024)
    p.add_argument("--long-tokens", type=int, default=6144)
    p.add_argument("--batch-tokens", type=int, default=256, help="each answer's tokens in (e)")
    p.add_argument("--batch-repeats", type=int, default=2, help="timed runs of each of (e)'s rows")
    p.add_argument("--contexts", default="8192,32768,100000")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--acceptance", default=ACCEPTANCE,
                   help="ROWS=TOKENS_A_STEP,... measured on a CPU, for (d) (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true",
                   help="on this machine's CPU at tiny shapes and lengths (the demo model)")
    args = p.parse_args()
    if not set(args.parts.split(",")) <= set("abcde"):
        p.error(f"--parts {args.parts}: a comma-separated list of a, b, c, d and e")
    decoders = args.decoders.split(",")
    if not set(decoders) <= {"ar", "auto", "hf"}:
        p.error(f"--decoders {args.decoders}: a comma-separated list of ar, auto and hf")
    args.model = args.model or ("demo" if args.dry_run else "smollm2")
    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    if args.dry_run:
        args.exact_tokens, args.chat_tokens, args.long_tokens = 24, 24, 48
        args.contexts, args.repeats = "300,1100", 1
        args.batch_tokens, args.batch_repeats = 12, 1
    paths = ["products"]
    if importlib.util.find_spec("triton") is not None:
        paths = ["triton+graphs", "triton", "products"]
        if not cuda:       # the kernels under Triton's interpreter (before triton is imported)
            os.environ["TRITON_INTERPRET"] = "1"
    meta = {"device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__, "dry_run": args.dry_run, "args": vars(args) | {
                "out": str(args.out)}}
    report = Report(args.out, args.budget_s, meta)
    costs = {}
    acceptance = {int(k): float(v) for k, v in
                  (item.split("=") for item in args.acceptance.split(","))}
    name = Path(args.model).stem
    draft = args.draft_model or DRAFT_MODELS.get(name)
    heads = args.heads or EAGLE_DRAFTERS.get(name)
    runs = {"a": lambda: exactness(report, args.model, device.type, args.exact_tokens, draft,
                                   heads),
            "b": lambda: speed(report, args.model, device.type, args.chat_tokens,
                               args.long_tokens, decoders),
            "c": lambda: step_costs(report, device, DRY_SHAPES if args.dry_run else SHAPES,
                                    [int(x) for x in args.contexts.split(",")],
                                    DRY_ROWS if args.dry_run else ROWS, paths, args.repeats,
                                    costs),
            "d": lambda: projected(report, costs, acceptance),
            "e": lambda: batches(report, args.model, device.type, args.batch_tokens,
                                 args.batch_repeats)}
    for part in args.parts.split(","):
        run = runs[part]
        try:
            run()
        # any failure (a kernel's compilation, memory, a peer's loading) is the part's result:
        # a lease is short, and the parts after it still run
        except Exception as e:  # noqa: BLE001
            report.failed(part, e)
    if report.data["errors"]:
        sys.exit(f"{len(report.data['errors'])} part(s) failed: see {args.out}")


if __name__ == "__main__":
    main()

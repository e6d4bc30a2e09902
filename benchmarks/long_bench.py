"""Long generations: tokens/s by segment as the context grows, memory, identity with `ar`.

Long generations: tokens/s per segment as the context grows, peak memory and KV bytes, and
the token-identity check against plain decoding (`ar`).

Each method writes --new-tokens tokens of one chat answer (EOS ignored: past the end of its
answer the model goes on with whatever it writes) with a progress bar; each row gives the rate
over every --segment tokens, so a run shows where the KV cache starts to cost more than the
weights (plot_long.py draws them), the distinct 4-grams of the tokens (how much of the text
repeats, which is what drafters feed on; `loop` where it is under 0.3: such a row times a loop,
not text) and where the answer ended (`answer_end`). With --check-tokens K, `ar` writes only the
first K tokens and the other methods are compared with it over those (the first tokens of a run
do not depend on its length: docs/design.md), which keeps a 32K-token run of one method
affordable.

    python benchmarks/long_bench.py --model qwen-coder-1.5b --new-tokens 8192 --methods ar,auto
    python benchmarks/long_bench.py --model qwen-coder-1.5b --new-tokens 32700 --methods auto \\
        --check-tokens 8192
    python benchmarks/long_bench.py --model qwen-coder-1.5b --draft-model qwen-coder-0.5b \\
        --new-tokens 8192 --methods ar,auto,auto@draft,draft

A method ending in `@draft` runs with --draft-model (`auto@draft`: `auto` with the draft model's
chains among its sources). One ending in `@again` runs right after the runs before it without
clearing the model's state: its suffix index holds their output, which for an exact method is
the same answer, so it drafts the answer itself, with its sizing as the earlier run left it.
`auto@again` after `auto` is the ceiling of speculation on the machine: what any drafter
could reach with `auto`'s trees.

    python benchmarks/long_bench.py --model qwen-coder-1.5b --new-tokens 8192 \\
        --methods ar,auto,auto@again

With --llamacpp, one more row: llama.cpp's plain decoding of the same GGUF file through
llama-cpp-python, the same number of tokens with end-of-sequence ignored, timed from its first
new token (at T>0 with its own sampler: other tokens, the same length).

    python benchmarks/long_bench.py --model qwen-coder-1.5b --setting tokenswift \\
        --new-tokens 8192 --methods ar,auto --llamacpp

With --llama-speculative BIN (llama.cpp's `llama-speculative-simple`, built from the sources
that llama-cpp-python's source distribution carries: docs/benchmarks/long-generation.md), one
more row: llama.cpp's own speculative decoding of the same prompt in the same setting (at T>0
with its own sampler: its text, the same length), with --draft-model as its draft and
--llama-draft-max tokens drafted a step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import tempfile
import time

import torch
from chat_bench import PROMPTS, sharegpt_prompts
from chat_bench import SETTINGS as CHAT_SETTINGS

import longspec
from longspec.bench.metrics import answer_end, distinct_n, is_loop
from longspec.bench.peers import Peers, peer_status
from longspec.bench.runner import parse_entry, split_entries
from longspec.drafters import METHODS
from longspec.request import encode_prompt

# chat_bench's, and TokenSwift's long-generation setting
SETTINGS = {**CHAT_SETTINGS, "tokenswift": longspec.SamplingConfig(
    temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024)}


def kv_bytes(model, positions: int) -> int:
    """The keys and values of every layer for `positions` tokens."""
    c = model.config
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * positions * model.dtype.itemsize


def timed(chunks, n: int, segment: int) -> tuple[list[int], list[dict], float]:
    """The tokens of `chunks` (lists of tokens as a decoder writes them, n in all), the rate over
    every `segment` of them (from the first chunk's arrival) and tokens/s from the first token
    to the last."""
    tokens: list[int] = []
    marks = []                       # (tokens, seconds since the first token) per segment
    begin = None
    for chunk in chunks:
        if begin is None:
            begin = time.perf_counter() - 1e-9
        before = len(tokens)
        tokens += chunk
        if len(tokens) // segment > before // segment or len(tokens) >= n:
            marks.append((len(tokens), time.perf_counter() - begin))
    segments = [{"to": n1, "tok_s": round((n1 - n0) / (t1 - t0), 2)}
                for (n0, t0), (n1, t1) in zip([(0, 0.0), *marks], marks)]
    return tokens, segments, (len(tokens) - 1) / marks[-1][1]


def llamacpp(peers: Peers, ids: list[int], n: int, sampling, segment: int = 1024) -> dict:
    """llama.cpp's plain decoding of the same file: n tokens, end-of-sequence ignored, timed
    from its first new token to its n-th (its prompt and first token left out, as `ar`'s
    decode time leaves them out), with its own sampler at T>0."""
    stream = itertools.islice(peers.llama_stream(peers.llama, ids, sampling, 0), n)
    tokens, segments, rate = timed(([t] for t in stream), n, segment)
    return {"tokens": tokens, "tok_s": rate, "segments": segments}


def run(model, draft, method: str, ids: list[int], n: int, sampling, segment: int) -> dict:
    method, again = method.removesuffix("@again"), method.endswith("@again")
    if not again:
        model.state.clear()
    method, with_draft = method.removesuffix("@draft"), method.endswith("@draft")
    entry = parse_entry(method, {})
    with_draft = with_draft or METHODS[entry.method].needs_draft_model
    s = longspec.stream(model, ids, max_new_tokens=n, method=entry.method, options=entry.options,
                        sampling=sampling, seed=0, ignore_eos=True, progress=True,
                        draft_model=draft if with_draft else None)
    tokens, segments, _ = timed((chunk.token_ids for chunk in s), n, segment)
    st = s.result.stats
    return {"tokens": tokens, "tok_s": st["tokens_per_s"], "len": st["mean_accepted_length"],
            "segments": segments, "peak_rss_bytes": st["peak_memory_bytes"],
            "kv_bytes": kv_bytes(model, len(ids) + len(tokens)), "decode_s": st["decode_s"],
            "sources": st.get("sources")}


def llama_sampling(sampling) -> list[str]:
    """llama.cpp's sampling flags for a setting: greedy as top-1, otherwise every filter given
    (its defaults, top-k 40, top-p 0.95 and min-p 0.05, turned off where the setting has none)
    and the penalty over the setting's window."""
    if sampling.greedy:
        return ["--temp", "0", "--top-k", "1"]
    return ["--temp", str(sampling.temperature), "--top-k", str(sampling.top_k),
            "--top-p", str(sampling.top_p), "--min-p", str(sampling.min_p),
            "--repeat-penalty", str(sampling.penalty),
            "--repeat-last-n", str(sampling.penalty_window), "--seed", "0"]


def llama_speculative(binary: str, model, draft, ids: list[int], n: int, draft_max: int,
                      sampling) -> dict:
    """llama.cpp's speculative decoding (end-of-sequence ignored; at T>0 its target's sampler
    decides each token, so its text is its own) of the prompt `ids`: tokens/s of its decoding
    and the share of drafted tokens accepted, as it reports them."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as prompt:
        prompt.write(model.tokenizer.decode(ids, skip_special_tokens=False))
        prompt.flush()
        done = subprocess.run(
            [binary, "-m", str(model.path), "-md", str(draft.path), "-f", prompt.name,
             "--no-escape", "-n", str(n), "--ignore-eos", *llama_sampling(sampling),
             "-t", str(torch.get_num_threads()), "-td", str(torch.get_num_threads()),
             "-c", str(len(ids) + n + 256), "--spec-type", "draft-simple",
             "--spec-draft-n-max", str(draft_max), "--spec-draft-n-min", "0"],
            capture_output=True, text=True, check=True)
    out = done.stdout + done.stderr
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", out)
    accept = re.search(r"accept\s+=\s+([\d.]+)%", out)
    if decoded is None or accept is None:
        raise RuntimeError(f"{binary} printed no timings; its output ends:\n{out[-2000:]}")
    tokens, seconds = int(decoded[1]), float(decoded[2])
    return {"method": f"llama.cpp speculative (draft {draft_max})", "new_tokens": tokens,
            "tok_s": round(tokens / seconds, 2), "accepted_share": float(accept[1]) / 100}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen-coder-1.5b")
    p.add_argument("--draft-model", help="draft model (methods draft, triforce)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--methods", default="ar,auto")
    p.add_argument("--new-tokens", type=int, default=8192)
    p.add_argument("--check-tokens", type=int,
                   help="ar writes only this many tokens, the others are compared over them")
    p.add_argument("--setting", default="greedy", choices=sorted(SETTINGS))
    p.add_argument("--prompt", type=int, default=0, help="index of chat_bench's prompts")
    p.add_argument("--sharegpt", action="store_true", help="--prompt indexes ShareGPT's "
                   "held-out questions (chat_bench.py --sharegpt) instead")
    p.add_argument("--segment", type=int, default=1024)
    p.add_argument("--llamacpp", action="store_true", help="one more row: llama.cpp's plain "
                   "decoding of the same GGUF file (llama-cpp-python), its own sampler at T>0")
    p.add_argument("--llama-speculative", metavar="BIN", help="llama.cpp's "
                   "llama-speculative-simple: one more row, with --draft-model as its draft")
    p.add_argument("--llama-draft-max", type=int, default=4, help="its tokens drafted a step")
    p.add_argument("--out", default="long_bench.json")
    args = p.parse_args()
    if args.llama_speculative and args.draft_model is None:
        p.error("--llama-speculative needs --draft-model")
    model = longspec.load_model(args.model, device=args.device)
    draft = (None if args.draft_model is None
             else longspec.load_model(args.draft_model, dtype=str(model.dtype)[6:],
                                      device=args.device))
    print(model.profile, flush=True)
    text = sharegpt_prompts(args.prompt + 1)[-1] if args.sharegpt else PROMPTS[args.prompt]
    ids = encode_prompt(model, [{"role": "user", "content": text}])
    sampling = SETTINGS[args.setting]
    methods = split_entries(args.methods)
    if args.check_tokens and "ar" not in methods:
        methods.insert(0, "ar")
    longspec.generate(model, ids, max_new_tokens=16, sampling=sampling, seed=0)   # warm-up
    results = {}
    for m in methods:
        n = args.check_tokens if m == "ar" and args.check_tokens else args.new_tokens
        r = results[m] = run(model, draft, m, ids, n, sampling, args.segment)
        row = {"method": m, "new_tokens": n, "tok_s": round(r["tok_s"], 2),
               "len": round(r["len"], 2), "peak_rss_gb": round(r["peak_rss_bytes"] / 1e9, 2),
               "kv_gb": round(r["kv_bytes"] / 1e9, 3),
               "distinct_4": round(distinct_n(r["tokens"], 4), 3), "loop": is_loop(r["tokens"]),
               # where the answer ends: the model goes on past end-of-turn
               "answer_end": answer_end(r["tokens"], model.eos_token_ids),
               "segments": r["segments"]}
        if r["sources"]:      # auto's nodes verified and accepted, by source
            row["sources"] = r["sources"]
        if m != "ar" and "ar" in results:
            ref = results["ar"]["tokens"]
            row["identical_over"] = min(len(ref), len(r["tokens"]))
            row["identical"] = r["tokens"][:len(ref)] == ref[:len(r["tokens"])]
            if not row["identical"]:
                row["first_difference"] = next(
                    i for i, (a, b) in enumerate(zip(r["tokens"], ref)) if a != b)
        print(json.dumps(row), flush=True)
        results[m]["row"] = row
    peer_rows = []
    if args.llamacpp:
        status = peer_status("llamacpp", model, sampling, len(ids) + args.new_tokens, False)
        if status.startswith(("ok", "approximate")):
            r = llamacpp(Peers(model, None, {"llamacpp"}), ids, args.new_tokens, sampling,
                         args.segment)
            row = {"method": "llama.cpp", "new_tokens": args.new_tokens,
                   "tok_s": round(r["tok_s"], 2),
                   "distinct_4": round(distinct_n(r["tokens"], 4), 3), "loop": is_loop(r["tokens"]),
                   "answer_end": answer_end(r["tokens"], model.eos_token_ids),
                   "segments": r["segments"]}
            if "ar" in results:      # how far it wrote what `ar` wrote (its own arithmetic)
                ref = results["ar"]["tokens"]
                row["same_as_ar_for"] = next((i for i, (a, b) in enumerate(zip(r["tokens"], ref))
                                              if a != b), min(len(ref), len(r["tokens"])))
        else:
            row = {"method": "llama.cpp", "status": status}
        peer_rows.append(row)
        print(json.dumps(row), flush=True)
    if args.llama_speculative:
        peer_rows.append(llama_speculative(args.llama_speculative, model, draft, ids,
                                           args.new_tokens, args.llama_draft_max, sampling))
        print(json.dumps(peer_rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "draft_model": args.draft_model,
                   "kernel_profile": model.profile.as_dict(), "setting": args.setting,
                   "prompt": args.prompt, "sharegpt": args.sharegpt,
                   "threads": torch.get_num_threads(),
                   "rows": [r["row"] for r in results.values()] + peer_rows}, f, indent=1)


if __name__ == "__main__":
    main()

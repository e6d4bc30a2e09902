"""Concurrent chat requests to `longspec serve` and to llama.cpp's server, side by side.

Each server runs alone on the machine (started here for each set of requests, stopped before
the next: longspec's server drafts from its earlier outputs, and would copy a set it had seen),
and gets the same chat requests (the first --requests of chat_bench.py's prompts, one seed each,
--max-tokens tokens with end-of-sequence ignored) twice: one at a time, then all at once. A row
gives the aggregate tokens/s (completion tokens over the wall time of the whole set), where each
answer reached end-of-sequence and the distinct-4 of what was timed. longspec's responses to the
concurrent set are checked against its responses one at a time, token for token (each request
must get what it gets alone). llama.cpp runs with --parallel set to the number of requests and
its own sampler (its tokens are not comparable).

    python benchmarks/serve_batch.py --model smollm2 --methods ar,auto --requests 4 \\
        --max-tokens 512 --llama-server /path/to/llama-server --out serve_batch.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from chat_bench import PROMPTS

import longspec
from longspec.bench.metrics import answer_end, distinct_n

PORT = 8391


def post(port: int, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {data}")
    return data


def wait_ready(port: int, proc: subprocess.Popen, path: str) -> None:
    end = time.monotonic() + 600
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not start")


def run_set(port: int, bodies: list[dict], together: bool) -> tuple[float, list[dict]]:
    """Wall seconds of the whole set and the responses, in order."""
    out: list[dict | None] = [None] * len(bodies)
    errors: list[Exception] = []

    def one(i: int) -> None:
        try:
            out[i] = post(port, bodies[i])
        except (OSError, RuntimeError, ValueError) as e:    # raised after the set
            errors.append(e)

    begin = time.perf_counter()
    if together:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(len(bodies)):
            one(i)
    seconds = time.perf_counter() - begin
    if errors:
        raise errors[0]
    return seconds, out


def row(server: str, method: str, together: bool, seconds: float, responses: list[dict],
        eos: set[int], tokenize) -> dict:
    ids = [r["choices"][0].get("token_ids") or tokenize(r["choices"][0]["message"]["content"])
           for r in responses]
    tokens = sum(r["usage"]["completion_tokens"] for r in responses)
    return {"server": server, "method": method, "requests": "together" if together else
            "one at a time", "seconds": round(seconds, 2), "completion_tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1),
            "answer_end": [answer_end(t, eos) for t in ids],
            "distinct4": [round(distinct_n(t, 4), 2) for t in ids]}


def longspec_rows(args, bodies: list[dict], eos: set[int], tokenize) -> list[dict]:
    """Each method's set one at a time, then together, each on a server started for it: a
    server keeps earlier outputs to draft from, and the same requests again would copy them."""
    cmd = [sys.executable, "-m", "longspec.cli", "serve", args.model, "--port", str(PORT),
           "--max-batch", str(args.requests), "--log-level", "warning"]
    rows = []
    for method in args.methods.split(","):
        mine = [{**b, "method": method, "return_token_ids": True} for b in bodies]
        answers = {}
        for together in (False, True):
            proc = subprocess.Popen(cmd)
            try:
                wait_ready(PORT, proc, "/health")
                post(PORT, {**bodies[0], "messages": [{"role": "user", "content": "Hello!"}],
                            "max_tokens": 32})           # warm-up
                seconds, answers[together] = run_set(PORT, mine, together)
            finally:
                proc.terminate()
                proc.wait()
            rows.append(row("longspec", method, together, seconds, answers[together], eos,
                            tokenize))
        rows[-1]["identical_to_alone"] = all(
            a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
            for a, b in zip(answers[False], answers[True]))
        print(json.dumps(rows[-2]), json.dumps(rows[-1]), sep="\n", flush=True)
    return rows


def llama_rows(args, bodies: list[dict], eos: set[int], tokenize, gguf: Path) -> list[dict]:
    context = args.requests * (args.max_tokens + 512)
    cmd = [args.llama_server, "-m", str(gguf), "--port", str(PORT), "--parallel",
           str(args.requests), "-c", str(context), "--threads", str(args.threads),
           "--threads-batch", str(args.threads), "--log-disable"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_ready(PORT, proc, "/health")
        post(PORT, {**bodies[0], "max_tokens": 32})
        for together in (False, True):
            seconds, responses = run_set(PORT, bodies, together)
            rows.append(row("llama.cpp", "plain", together, seconds, responses, eos, tokenize))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--methods", default="ar,auto")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--penalty", type=float, default=1.0,
                   help="the contextual penalty (longspec's repetition_penalty over the last "
                   "--penalty-window tokens; llama.cpp's repeat_penalty over as many)")
    p.add_argument("--penalty-window", type=int, default=256)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary (left out: none)")
    p.add_argument("--out")
    args = p.parse_args()
    model = longspec.load_model(args.model)
    eos = set(model.eos_token_ids)

    def tokenize(text: str) -> list[int]:
        return model.tokenizer.encode(text, add_special_tokens=False)

    bodies = [{"model": args.model, "messages": [{"role": "user", "content": prompt}],
               "max_tokens": args.max_tokens, "temperature": args.temperature,
               "top_p": args.top_p, "seed": i, "ignore_eos": True}
              for i, prompt in enumerate(PROMPTS[:args.requests])]
    if args.penalty != 1.0:
        for body in bodies:
            body.update(repetition_penalty=args.penalty, penalty_window=args.penalty_window,
                        repeat_penalty=args.penalty, repeat_last_n=args.penalty_window)
    rows = longspec_rows(args, bodies, eos, tokenize)
    if args.llama_server:
        rows += llama_rows(args, bodies, eos, tokenize, model.path)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()

"""Prompts computed once: the first new token of a request sharing a prefix, against cold.

Prompts computed once: the time to the first new token of a request whose first `--prefix`
tokens an earlier request sent, against the same request with the prompt cache cleared (cold),
in Python and through the server (streamed, timed by the client from the request to the first
text), and a chat's second turn against the same turn cold; the tokens of each pair compared.
One process, the runs of each pair side by side, medians of `--repeats`.

`--edit MODULE`: a standard-library module edited through the server in a chat of two turns
(the first turn asks for predicted_outputs.py's rename, the second for another function
renamed in the answer), each `auto` request with the file it edits as its prediction, streamed
and timed by the client to the first text and to the end, prefill included: `ar` then `auto`,
each from a fresh `longspec serve` process of its own (this one the client), its second turn
reusing its first turn's prompt and answer from the prompt cache; `--api messages` sends the
turns through Anthropic's Messages API (an agent's loop), the prediction as its extension field.

`--llama-cpp`: the Python pair with llama.cpp (llama-cpp-python) on the same GGUF file and
token ids instead, in a process of its own: its `generate` keeps the last sequence's keys and
values and evaluates only what follows their common prefix (cold: after `reset()`).

    python benchmarks/prompt_cache.py --model smollm2 --prefix 2048 --out result.json
    python benchmarks/prompt_cache.py --model smollm2 --prefix 2048 --llama-cpp
    python benchmarks/prompt_cache.py --model qwen-coder-1.5b --edit colorsys --out edit.json
    python benchmarks/prompt_cache.py --model qwen-coder-1.5b --edit fnmatch --api messages
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import inspect
import json
import socket
import statistics
import subprocess
import sys
import threading
import time

import torch
import uvicorn
from predicted_outputs import RENAMES, edit_prompt

import longspec
from longspec.bench.metrics import answer_end, distinct_n
from longspec.bench.prompts import default_prompt_text
from longspec.request import encode_prompt
from longspec.serve import ServeConfig, create_app

GREEDY = longspec.SamplingConfig(temperature=0)
NEW_TOKENS = 16
# module -> the function its second turn renames, and its new name
SECOND_RENAMES = {"colorsys": ("hls_to_rgb", "hue_lightness_saturation_to_rgb"),
                  "fnmatch": ("fnmatchcase", "match_case_sensitively"),
                  "textwrap": ("indent", "prefix_lines")}
TAILS = ("\n\n# What the code above does, in one paragraph:\n#",
         "\n\n# The three most important functions above, and why:\n#")


def python_pair(model, prefix: list[int]) -> dict:
    """First-token seconds of the second tail's request: cold, then after the first's."""
    first, second = (prefix + encode_prompt(model, tail) for tail in TAILS)
    cache = model.state.prompt_cache
    cache.clear()
    cold = longspec.generate(model, second, max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    cache.clear()
    longspec.generate(model, first, max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    hit = longspec.generate(model, second, max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    return pair(cold, hit)


def llama_pair(llm, model, prefix: list[int]) -> dict:
    """python_pair's requests on llama.cpp: seconds to the first token of the second, cold
    and after the first."""
    first, second = (prefix + encode_prompt(model, tail) for tail in TAILS)

    def first_token(tokens: list[int]) -> tuple[float, int]:
        begin = time.perf_counter()
        stream = llm.generate(tokens, temp=0.0, reset=True)
        token = next(stream)
        seconds = time.perf_counter() - begin
        stream.close()
        return seconds, token

    llm.reset()
    cold_s, cold = first_token(second)
    llm.reset()
    first_token(first)
    hit_s, hit = first_token(second)
    return {"cold_s": cold_s, "hit_s": hit_s, "prompt_tokens": len(second),
            "cached_tokens": None, "identical": cold == hit}


def chat_pair(model, document: str) -> dict:
    """A chat's second turn (the first turn's prompt and answer before it), cold and after
    the first turn."""
    turn = [{"role": "user", "content": f"```python\n{document}\n```\nWhat does this do?"}]
    cache = model.state.prompt_cache
    cache.clear()
    answer = longspec.generate(model, turn, max_new_tokens=64, sampling=GREEDY)
    second = turn + [{"role": "assistant", "content": answer.text},
                     {"role": "user", "content": "Which function is the most important?"}]
    hit = longspec.generate(model, second, max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    cache.clear()
    cold = longspec.generate(model, second, max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    return pair(cold, hit)


def pair(cold, hit) -> dict:
    return {"cold_s": cold.stats["first_token_s"], "hit_s": hit.stats["first_token_s"],
            "prompt_tokens": hit.prompt_tokens, "cached_tokens": hit.stats["cached_tokens"],
            "identical": cold.token_ids == hit.token_ids}


class Client:
    """Requests to a server on a loopback port, streamed and timed from the request."""

    port: int
    model_id = "m"

    def first_token(self, prompt: list[int]) -> tuple[float, list[int], int]:
        """Seconds from the request to the first streamed text, the tokens, and the usage's
        cached_tokens."""
        body = {"model": self.model_id, "prompt": prompt, "max_tokens": NEW_TOKENS,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                "return_token_ids": True}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        begin = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        first, tokens, cached = None, [], 0
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                cached = event["usage"]["prompt_tokens_details"]["cached_tokens"]
            for choice in event["choices"]:
                if first is None and choice["text"]:
                    first = time.perf_counter() - begin
                tokens += choice.get("token_ids") or []
        conn.close()
        return first, tokens, cached

    def turn(self, api: str, messages: list[dict], prediction: str, method: str,
             max_tokens: int) -> dict:
        """One turn of an edit through the chat endpoint or the Messages API (`api`: "chat"
        or "messages"), streamed: seconds from the request to the first text and to the end,
        the tokens, the text, and the prompt's tokens and those the prompt cache held."""
        body = {"model": self.model_id, "messages": messages, "max_tokens": max_tokens,
                "temperature": 0, "method": method, "return_token_ids": True, "stream": True}
        if method != "ar":         # plain decoding takes no prediction
            body["prediction"] = {"type": "content", "content": prediction}
        if api == "chat":
            body["stream_options"] = {"include_usage": True}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        begin = time.perf_counter()
        conn.request("POST", "/v1/chat/completions" if api == "chat" else "/v1/messages",
                     json.dumps(body), {"Content-Type": "application/json"})
        out = {"first_token_s": None, "text": "", "token_ids": []}
        for raw in conn.getresponse():
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"the server refused the edit: {event['error']['message']}")
            text = _event_text(api, event, out)
            if text and out["first_token_s"] is None:
                out["first_token_s"] = time.perf_counter() - begin
            out["text"] += text
        out["seconds"] = time.perf_counter() - begin
        conn.close()
        return out


class Server(Client):
    """The model behind `longspec serve`'s app on a free loopback port, in a thread."""

    def __init__(self, model):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.sock, self.port = sock, sock.getsockname()[1]
        app = create_app(model, ServeConfig(self.model_id, method="auto"))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                         daemon=True).start()
        while not self.server.started:
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True


class ServerProcess(Client):
    """`longspec serve MODEL` in a process of its own, as an agent reaches it: a client in the
    server's process shares its interpreter and cores with the generation (plain decoding of
    the 1.5B through a server in this process took 46-49 ms a token where the same request to
    a server process took 34 ms; AVX-512, 2 cores)."""

    def __init__(self, model_name: str):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "longspec.cli", "serve", model_name, "--served-model-name",
             self.model_id, "--method", "auto", "--port", str(self.port), "--log-level",
             "warning"])
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"longspec serve {model_name} exited "
                                   f"({self.process.returncode})")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(1)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()


def server_pair(model, server: Server, prefix: list[int]) -> dict:
    first, second = (prefix + encode_prompt(model, tail) for tail in TAILS)
    cache = model.state.prompt_cache
    cache.clear()
    cold_s, cold_tokens, _ = server.first_token(second)
    cache.clear()
    server.first_token(first)
    hit_s, hit_tokens, cached = server.first_token(second)
    return {"cold_s": cold_s, "hit_s": hit_s, "prompt_tokens": len(second),
            "cached_tokens": cached, "identical": cold_tokens == hit_tokens}


def _event_text(api: str, event: dict, out: dict) -> str:
    """The text an event of a streamed turn adds; its token ids and usage kept in `out`."""
    if api == "chat":
        if event.get("usage"):
            out["prompt_tokens"] = event["usage"]["prompt_tokens"]
            out["cached_tokens"] = event["usage"]["prompt_tokens_details"]["cached_tokens"]
        for choice in event["choices"]:
            out["token_ids"] += choice.get("token_ids") or []
        return "".join(c["delta"].get("content") or "" for c in event["choices"])
    if event["type"] == "message_delta":
        usage = event["usage"]
        out["token_ids"] = event["token_ids"]
        out["cached_tokens"] = usage["cache_read_input_tokens"]
        out["prompt_tokens"] = usage["input_tokens"] + usage["cache_read_input_tokens"]
    delta = event.get("delta") or {}
    return delta.get("text", "") if delta.get("type") == "text_delta" else ""


def edit_turns(model, name: str, module: str, max_tokens: int, api: str) -> list[dict]:
    """Both turns of the module's edit, `ar` then `auto`, each method from a fresh server
    process of model `name` (rows: seconds to the first token and end to end, tokens, cached
    tokens, where the answer ended, its distinct-4, identical to `ar`'s)."""
    source = inspect.getsource(importlib.import_module(module))
    second_old, second_new = SECOND_RENAMES[module]
    rows, reference = [], {}
    for method in ("ar", "auto"):
        server = ServerProcess(name)
        messages = [{"role": "user", "content": edit_prompt(module, source)}]
        prediction = source
        try:
            for turn in (1, 2):
                answer = server.turn(api, messages, prediction, method, max_tokens)
                tokens = answer["token_ids"]
                rows.append({"module": module, "api": api, "method": method, "turn": turn,
                             "first_token_s": round(answer["first_token_s"], 2),
                             "seconds": round(answer["seconds"], 2), "tokens": len(tokens),
                             "prompt_tokens": answer["prompt_tokens"],
                             "cached_tokens": answer["cached_tokens"],
                             "answer_end": answer_end(tokens, model.eos_token_ids),
                             "distinct_4": round(distinct_n(tokens, 4), 2),
                             "identical": reference.setdefault(turn, tokens) == tokens})
                print(json.dumps(rows[-1]), flush=True)
                messages = messages + [
                    {"role": "assistant", "content": answer["text"]},
                    {"role": "user", "content": f"Now also rename `{second_old}` to `{second_new}` "
                     "wherever it appears. Return the whole module again, nothing else."}]
                prediction = answer["text"]
        finally:
            server.close()
    return rows


def loop_summary(rows: list[dict]) -> dict:
    """auto over ar end to end (both turns), and each method's second turn's first token as a
    share of its first turn's."""
    seconds = {m: sum(r["seconds"] for r in rows if r["method"] == m) for m in ("ar", "auto")}
    first = {(r["method"], r["turn"]): r["first_token_s"] for r in rows}
    return {"auto_over_ar": round(seconds["ar"] / seconds["auto"], 2),
            "second_first_token_share": {m: round(first[m, 2] / first[m, 1], 4)
                                         for m in ("ar", "auto")},
            "identical": all(r["identical"] for r in rows)}


def summary(runs: list[dict]) -> dict:
    cold = statistics.median(r["cold_s"] for r in runs)
    hit = statistics.median(r["hit_s"] for r in runs)
    return {"cold_s": round(cold, 3), "hit_s": round(hit, 3),
            "hit_share": round(hit / cold, 4), "prompt_tokens": runs[0]["prompt_tokens"],
            "cached_tokens": runs[0]["cached_tokens"],
            "identical": all(r["identical"] for r in runs), "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prefix", type=int, default=2048, help="tokens the requests share")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--edit", metavar="MODULE", help=f"instead: the edit in two turns of one "
                   f"of {', '.join(RENAMES)}")
    p.add_argument("--max-tokens", type=int, default=3000, help="of an edit's answer")
    p.add_argument("--api", choices=("chat", "messages"), default="chat", help="the edit's "
                   "endpoint: chat completions, or Anthropic's Messages API")
    p.add_argument("--llama-cpp", action="store_true", help="instead: llama.cpp's side")
    p.add_argument("--out", help="write the results as JSON here too")
    args = p.parse_args()
    model = longspec.load_model(args.model)
    print(f"kernel profile: {model.profile.describe()}", flush=True)
    if args.edit:
        rows = edit_turns(model, args.model, args.edit, args.max_tokens, args.api)
        loop = loop_summary(rows)
        print(f"loop: {json.dumps(loop)}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"model": args.model, "profile": model.profile.describe(),
                           "rows": rows, "loop": loop}, f, indent=1)
        return
    text = default_prompt_text()
    prefix = encode_prompt(model, text)[:args.prefix]
    if args.llama_cpp:
        from llama_cpp import Llama

        llm = Llama(model_path=str(model.path), n_ctx=4 * args.prefix,
                    n_threads=torch.get_num_threads(), verbose=False)
        row = summary([llama_pair(llm, model, prefix) for _ in range(args.repeats)])
        print(f"llama.cpp: {json.dumps({k: v for k, v in row.items() if k != 'runs'})}")
        return
    longspec.generate(model, prefix[:64], max_new_tokens=4)     # warm-up
    document = model.tokenizer.decode(prefix[:args.prefix - 80])
    server = Server(model)
    results = {"model": args.model, "profile": model.profile.describe(), "prefix": args.prefix}
    for name, one in (("python", lambda: python_pair(model, prefix)),
                      ("server", lambda: server_pair(model, server, prefix)),
                      ("chat", lambda: chat_pair(model, document))):
        results[name] = summary([one() for _ in range(args.repeats)])
        row = {k: v for k, v in results[name].items() if k != "runs"}
        print(f"{name}: {json.dumps(row)}", flush=True)
    server.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""How long a running stream waits when a long, schema-constrained request arrives at a running
`longspec serve`: the gaps between the stream's tokens before the arrival, and the longest one
while the new request is admitted (its prompt prefilled, its grammar compiled) and answered.

A stream of --stream-tokens (end-of-sequence ignored) starts; after --warm of its tokens, a
completion with a prompt of --prompt-tokens token ids and a JSON schema arrives. Prints and
writes (--out) the stream's median gap before the arrival, its longest gap from the arrival to
the new request's answer, and the new request's latency.

    longspec serve demo --port 8000 &
    python benchmarks/arrival_gap.py --url http://127.0.0.1:8000 --out gap.json
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import statistics
import threading
import time
from urllib.parse import urlparse

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "size": {"type": "integer"}},
          "required": ["name", "size"], "additionalProperties": False}


def connect(url: str, timeout: float = 600) -> http.client.HTTPConnection:
    u = urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def model_id(url: str) -> str:
    conn = connect(url)
    conn.request("GET", "/v1/models")
    return json.loads(conn.getresponse().read())["data"][0]["id"]


def stream_times(url: str, body: dict, times: list[float], started: threading.Event) -> None:
    """The arrival time of each of the stream's tokens, appended to `times` as they come."""
    conn = connect(url)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    for line in resp:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices", []):
            now = time.perf_counter()
            times.extend([now] * len(choice.get("token_ids") or []))
        if len(times) >= 1:
            started.set()
    conn.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--stream-tokens", type=int, default=600)
    p.add_argument("--warm", type=int, default=40, help="stream tokens before the arrival")
    p.add_argument("--prompt-tokens", type=int, default=4000)
    p.add_argument("--out", help="write the result as JSON here")
    args = p.parse_args()
    model = model_id(args.url)
    times: list[float] = []
    started = threading.Event()
    running = threading.Thread(target=stream_times, args=(args.url, {
        "model": model, "prompt": "def main():\n", "max_tokens": args.stream_tokens,
        "ignore_eos": True, "seed": 1, "return_token_ids": True}, times, started))
    running.start()
    started.wait()
    while len(times) < args.warm:
        time.sleep(0.005)
    arrival = time.perf_counter()
    conn = connect(args.url)
    conn.request("POST", "/v1/completions", json.dumps({
        "model": model, "prompt": [(7 * i) % 1000 + 100 for i in range(args.prompt_tokens)],
        "max_tokens": 16, "seed": 2, "response_format": {
            "type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}}),
        {"Content-Type": "application/json"})
    status = conn.getresponse().status
    answered = time.perf_counter()
    conn.close()
    running.join()
    before = [b - a for a, b in itertools.pairwise(times) if b <= arrival]
    during = [b - a for a, b in itertools.pairwise(times) if b > arrival and a <= answered]
    result = {"model": model, "prompt_tokens": args.prompt_tokens, "status": status,
              "stream_tokens": len(times),
              "median_gap_before_s": round(statistics.median(before), 4),
              "longest_gap_while_admitted_s": round(max(during), 3),
              "arrival_latency_s": round(answered - arrival, 3)}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

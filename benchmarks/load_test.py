"""Load test of a running `longspec serve`: N concurrent clients for T seconds.

Each client sends completions back to back (streamed with --stream) with its own seed, and
checks every response: status 200, a finish reason, a streamed response that ends in
`data: [DONE]` with no error event, completion_tokens == max_tokens when the reason is
"length", and the same text as the client's first response (same prompt and seed: any
difference means requests leaked into each other). Reports latency p50/p90/p99 (time to first
token too, when streaming), tokens/s over the run, and the server's resident memory before and
after (process_resident_memory_bytes from /metrics). Exits 1 on any failed, truncated or
mismatched response, or any 503 (keep N <= --max-queue + 1 of the server).

    longspec serve demo --port 8000 &
    python benchmarks/load_test.py --url http://127.0.0.1:8000 --clients 4 --seconds 60 \\
        --max-tokens 128 --stream --out load.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time
from urllib.parse import urlparse


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


class Target:
    def __init__(self, url: str, api_key: str | None):
        u = urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path: str) -> str:
        conn = self.connect(30)
        conn.request("GET", path, headers=self.headers)
        body = conn.getresponse().read().decode()
        conn.close()
        return body

    def model(self) -> str:
        return json.loads(self.get("/v1/models"))["data"][0]["id"]

    def rss_bytes(self) -> float | None:
        for line in self.get("/metrics").splitlines():
            if line.startswith("process_resident_memory_bytes "):
                return float(line.split()[-1])
        return None


def one_request(target: Target, body: dict, timeout: float) -> dict:
    """Send one completion; return its outcome: ok, text, tokens, latency, ttft, problem."""
    begin = time.perf_counter()
    conn = target.connect(timeout)
    out = {"ok": False, "text": "", "tokens": 0, "ttft": None, "problem": None}
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), target.headers)
        resp = conn.getresponse()
        out["status"] = resp.status
        if resp.status != 200:
            out["problem"] = f"status {resp.status}: {resp.read()[:200]!r}"
            return out
        if body.get("stream"):
            finish, done = None, False
            for raw in resp:
                if not raw.startswith(b"data: "):
                    continue
                data = raw[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    out["problem"] = f"error event: {event['error']['message']}"
                    return out
                if event.get("usage"):
                    out["tokens"] = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    if choice.get("text") and out["ttft"] is None:
                        out["ttft"] = time.perf_counter() - begin
                    out["text"] += choice.get("text", "")
                    finish = choice.get("finish_reason") or finish
            if not done or finish is None:
                out["problem"] = "truncated stream (no finish_reason or no [DONE])"
                return out
        else:
            payload = json.loads(resp.read())
            choice = payload["choices"][0]
            out["text"], finish = choice["text"], choice["finish_reason"]
            out["tokens"] = payload["usage"]["completion_tokens"]
        if finish == "length" and out["tokens"] != body["max_tokens"]:
            out["problem"] = f"truncated: {out['tokens']} of {body['max_tokens']} tokens"
            return out
        out["ok"] = True
    except (OSError, ValueError, KeyError) as e:
        out["problem"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
        out["latency"] = time.perf_counter() - begin
    return out


def client(target: Target, index: int, args, model: str, end: float, results: list, lock):
    body = {"model": model, "prompt": args.prompt, "max_tokens": args.max_tokens,
            "seed": index, "temperature": args.temperature, "ignore_eos": True,
            "stream": args.stream, "method": args.method}
    if args.stream:
        body["stream_options"] = {"include_usage": True}
    if body["method"] is None:
        del body["method"]
    first_text = None
    while time.monotonic() < end:
        r = one_request(target, body, args.timeout)
        if r["ok"]:
            if first_text is None:
                first_text = r["text"]
            elif r["text"] != first_text:
                r["ok"], r["problem"] = False, "mismatch: same prompt and seed, other text"
        r["client"] = index
        with lock:
            results.append(r)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt", default="def parse(text):\n")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--method", help="method per request (default: the server's)")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--timeout", type=float, default=900, help="client timeout per request")
    p.add_argument("--out", help="write the summary as JSON here too")
    args = p.parse_args()

    target = Target(args.url, args.api_key)
    model = target.model()
    rss_before = target.rss_bytes()
    results: list[dict] = []
    lock = threading.Lock()
    begin = time.monotonic()
    end = begin + args.seconds
    threads = [threading.Thread(target=client, args=(target, i, args, model, end, results,
                                                     lock)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - begin
    rss_after = target.rss_bytes()

    ok = [r for r in results if r["ok"]]
    latencies = [r["latency"] for r in ok]
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    problems = [f"client {r['client']}: {r['problem']}" for r in results if not r["ok"]]
    summary = {
        "clients": args.clients, "seconds": round(wall, 1), "stream": args.stream,
        "max_tokens": args.max_tokens, "requests": len(results), "ok": len(ok),
        "failed": len(problems),
        "rejected_503": sum(1 for r in results if r.get("status") == 503),
        "latency_s": {f"p{q}": percentile(latencies, q) for q in (50, 90, 99)},
        "ttft_s": {f"p{q}": percentile(ttfts, q) for q in (50, 90, 99)} if ttfts else None,
        "mean_latency_s": statistics.fmean(latencies) if latencies else None,
        "tokens_per_s": sum(r["tokens"] for r in ok) / wall,
        "server_rss_bytes": {"before": rss_before, "after": rss_after},
        "problems": problems[:20],
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

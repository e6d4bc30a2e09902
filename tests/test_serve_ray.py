"""`longspec serve --ray-replicas 2`: two Ray Serve replicas (a real local Ray instance, one
loaded model each) behind one endpoint, each concurrent response what the library writes for
the request alone."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import longspec

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail("the replicas did not come up")


def test_two_ray_serve_replicas_answer_as_the_library_does():
    pytest.importorskip("ray")
    pytest.importorskip("grpc")       # Ray Serve's own dependencies (the extra's ray[serve])
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "longspec.cli", "serve", "demo", "--port",
                             str(port), "--ray-replicas", "2", "--dtype", "float32",
                             "--max-batch", "2", "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(port, proc)
        bodies = [{"model": "demo", "prompt": prompt, "max_tokens": 24, "temperature": 0.8,
                   "seed": seed, "return_token_ids": True}
                  for seed, prompt in enumerate(["def parse(text):", "import os\n",
                                                 "class Tree:", "for x in"])]
        answers: list = [None] * len(bodies)

        def ask(i: int) -> None:
            answers[i] = post(port, bodies[i])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    model = longspec.load_model("demo", dtype="float32")
    for body, answer in zip(bodies, answers):
        expect = longspec.generate(model, body["prompt"], max_new_tokens=24, seed=body["seed"],
                                   sampling=longspec.SamplingConfig(temperature=0.8),
                                   method="auto")
        assert answer["choices"][0]["token_ids"] == expect.token_ids

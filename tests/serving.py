"""A longspec server on a free loopback port in a background thread, a raw HTTP helper, and the
demo model with a chat template."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import threading
import time
from pathlib import Path

import uvicorn

import longspec
from longspec.serve import ServeConfig, create_app

# a chat template that takes tools and writes calls as Hermes-style blocks (as Qwen2.5's does)
TEMPLATE = (
    "{% if tools %}<|endoftext|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
    "\nCall one as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call>\n{% endif %}"
    "{% for m in messages %}<|endoftext|>{{ m['role'] }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{\"name\": \""
    "{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n"
    "</tool_call>\n{% endfor %}{% else %}{{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")


def demo_chat(out: Path, template: str = TEMPLATE) -> Path:
    """A copy of the demo model at `out` whose tokenizer has this chat template."""
    shutil.copytree(longspec.demo_path("demo"), out)
    cfg_path = out / "tokenizer_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()),
                                    "chat_template": template}))
    return out


class ServerThread:
    def __init__(self, model, config: ServeConfig):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(model, config)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        end = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < end and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 60):
        """(status, headers, parsed JSON or text) of one request; `body` may be raw bytes."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read().decode()
        conn.close()
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = raw
        return resp.status, dict(resp.getheaders()), parsed

    def health(self) -> dict:
        return self.request("GET", "/health")[2]

    def wait_idle(self, timeout: float = 5.0) -> float:
        """Seconds until the worker runs nothing and nothing waits."""
        begin = time.monotonic()
        while True:
            h = self.health()
            if not h["running"] and not h["waiting"]:
                return time.monotonic() - begin
            assert time.monotonic() - begin < timeout, f"the worker is still busy: {h}"
            time.sleep(0.02)

    def wait_running(self, waiting: int = 0, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while True:
            h = self.health()
            if h["running"] and h["waiting"] >= waiting:
                return
            assert time.monotonic() < end, f"the worker did not start: {h}"
            time.sleep(0.02)

    def open_stream(self, body: dict, headers=None) -> http.client.HTTPConnection:
        """Start a streamed request and read its first event; the caller closes it."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.readline().startswith(b"data: ")
        conn.resp = resp
        return conn

    def metric(self, name: str) -> float:
        text = self.request("GET", "/metrics")[2]
        series = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        return sum(float(v) for key, v in series if key == name or key.startswith(name + "{"))

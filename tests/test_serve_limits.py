"""`longspec serve` at its limits: the API key, a full queue (503 + Retry-After), request
timeouts (504, or an error event in a stream), and the command's flags."""

import http.client
import json

import openai
import pytest
import uvicorn
from serving import ServerThread

import longspec
from longspec.cli import main
from longspec.serve import ServeConfig, default_method
from longspec.serve.config import served_name

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"model": "demo", "prompt": "def main():\n", "max_tokens": 5000, "ignore_eos": True}


@pytest.fixture(scope="module")
def model():
    return longspec.load_model("demo", dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def guarded(model):
    with ServerThread(model, ServeConfig("demo", api_key=KEY, max_queue=1, max_batch=1)) as s:
        yield s


@pytest.fixture(scope="module")
def hasty(model):
    with ServerThread(model, ServeConfig("demo", request_timeout=1.5)) as s:
        yield s


def test_a_served_path_is_known_by_its_short_id_and_still_accepted(model):
    assert served_name("qwen-coder-1.5b") == "qwen-coder-1.5b"
    assert served_name("/m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") == \
        "qwen2.5-coder-1.5b-instruct-q4_k_m"
    assert served_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    assert served_name("checkpoints/tiny/") == "tiny"
    path = "/m/demo.gguf"
    with ServerThread(model, ServeConfig(served_name(path), aliases=(path,))) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["demo"]
        for name in ("demo", path):
            res = client.completions.create(model=name, prompt="x", max_tokens=2)
            assert res.model == "demo"


def test_the_api_key_is_required_on_v1_routes(guarded):
    wrong = openai.OpenAI(base_url=guarded.url + "/v1", api_key="guess", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.completions.create(model="demo", prompt="x", max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    status, headers, body = guarded.request("GET", "/v1/models")
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert "missing" in body["error"]["message"] and body["error"]["type"]
    status, _, _ = guarded.request("POST", "/v1/completions", b"{not json")
    assert status == 401                  # the key is checked before the body is read
    right = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)
    assert right.completions.create(model="demo", prompt="x", max_tokens=2).choices
    assert guarded.request("GET", "/health")[0] == 200      # probes need no key
    assert guarded.request("GET", "/metrics")[0] == 200


def test_a_full_queue_is_refused_at_once_with_retry_after(guarded):
    running = guarded.open_stream(LONG, AUTH)
    guarded.wait_running()
    waiting = http.client.HTTPConnection("127.0.0.1", guarded.port, timeout=60)
    waiting.request("POST", "/v1/completions", json.dumps(LONG),
                    {"Content-Type": "application/json", **AUTH})
    guarded.wait_running(waiting=1)
    status, headers, body = guarded.request("POST", "/v1/completions", LONG, AUTH, timeout=10)
    assert status == 503 and int(headers["retry-after"]) >= 1
    assert body["error"]["code"] == "queue_full"
    waiting.close()                       # leaves while queued: its job is dropped unrun
    running.resp.close()
    running.close()
    assert guarded.wait_idle() < 3
    ok = guarded.request("POST", "/v1/completions", {**LONG, "max_tokens": 2}, AUTH)
    assert ok[0] == 200


def test_a_request_past_its_timeout_gets_504_and_the_worker_moves_on(hasty):
    status, _, body = hasty.request("POST", "/v1/completions", LONG)
    assert status == 504 and body["error"]["code"] == "request_timeout"
    assert hasty.wait_idle() < 2


def test_a_stream_past_its_timeout_ends_with_an_error_event_then_done(hasty):
    conn = hasty.open_stream(LONG)
    events = [line[6:].decode().strip() for line in conn.resp if line.startswith(b"data: ")]
    conn.close()
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    assert all("choices" in json.loads(e) for e in events[:-2]) and len(events) > 3
    client = openai.OpenAI(base_url=hasty.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError, match="request timeout"):
        for _ in client.completions.create(model="demo", prompt="x", max_tokens=5000,
                                           stream=True, extra_body={"ignore_eos": True}):
            pass


def test_serve_command_passes_its_flags_to_the_app(monkeypatch):
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    assert main(["serve", "demo", "--api-key", KEY, "--max-queue", "3", "--request-timeout",
                 "7", "--method", "pld", "--port", "8123", "--dtype", "float32",
                 "--max-batch", "3"]) == 0
    cfg = seen["app"].state.server.config
    seen["app"].state.server.worker.stop()      # uvicorn did not run: no lifespan stops it
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 8123)
    assert (cfg.model_name, cfg.method, cfg.api_key, cfg.max_queue, cfg.request_timeout,
            cfg.max_batch) == ("demo", "pld", KEY, 3, 7.0, 3)
    assert main(["serve", "demo", "--dtype", "float32"]) == 0
    assert seen["app"].state.server.config.method == default_method()
    seen["app"].state.server.worker.stop()
    assert default_method() == ("auto" if "auto" in longspec.METHODS else "ar")


@pytest.mark.parametrize("argv,match", [
    (["--max-queue", "0"], "--max-queue must be at least 1"),
    (["--max-batch", "0"], "--max-batch must be at least 1"),
    (["--ray-replicas", "0"], "--ray-replicas must be at least 1"),
    (["--request-timeout", "0"], "--request-timeout must be > 0"),
    (["--method", "nope"], "unknown method"),
    (["--api-key", ""], "--api-key is empty"),
])
def test_serve_command_refuses_bad_flags_before_loading(capsys, argv, match):
    assert main(["serve", "/nonexistent/model", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err

"""`longspec serve` with the `openai` package as the client, against a server on a free loopback
port: outputs equal the library's token for token, streamed or whole, concurrent or not, free or
held to a grammar (OpenAI's response_format, the client's `parse`, vLLM's structured_outputs);
bad requests get OpenAI-style 4xx errors; dropped clients free the worker; metrics count."""

import json
import sys
import threading
import time
from pathlib import Path

import openai
import pydantic
import pytest
from serving import ServerThread, demo_chat

import longspec
from longspec.openai_api.responses import speculative
from longspec.serve import ServeConfig, default_method

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}},
    {"type": "function", "function": {
        "name": "search", "parameters": {"type": "object", "required": ["query"],
                                         "additionalProperties": False,
                                         "properties": {"query": {"type": "string",
                                                                  "maxLength": 16}}}}}]
MESSAGES = [{"role": "system", "content": "Write Python."},
            {"role": "user", "content": "A function that parses a date."}]
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 11,
           "extra_body": {"min_p": 0.05, "top_k": 50, "repetition_penalty": 1.2,
                          "penalty_window": 32, "method": "pld", "ignore_eos": True,
                          "return_token_ids": True}}
SAMPLED_SETTINGS = {"sampling": longspec.SamplingConfig(temperature=0.8, top_p=0.9, min_p=0.05,
                                                        top_k=50, penalty=1.2,
                                                        penalty_window=32),
                    "seed": 11, "method": "pld", "ignore_eos": True}


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return demo_chat(tmp_path_factory.mktemp("serve") / "demo-chat")


@pytest.fixture(scope="module")
def model(chat_dir):
    return longspec.load_model(chat_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def server(model):
    with ServerThread(model, ServeConfig("demo-chat", method=default_method())) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


def test_models_lists_the_served_model_and_health_is_ok(client, server):
    models = client.models.list()
    assert [m.id for m in models] == ["demo-chat"]
    health = server.health()
    assert health["status"] == "ok"
    # the kernel profile the tokens rest on, on both
    assert models.data[0].model_extra["kernel_profile"] == health["kernel_profile"]
    assert health["kernel_profile"]["row_check"] == "passed" and health["speculation"] == "on"


@pytest.mark.parametrize("sampled", [False, True])
def test_completion_is_token_identical_to_generate(client, model, sampled):
    kwargs = SAMPLED if sampled else {"temperature": 0, "extra_body": {"return_token_ids": True}}
    res = client.completions.create(model="demo-chat", prompt="def parse(text):\n",
                                    max_tokens=40, **kwargs)
    ref = longspec.generate(model, "def parse(text):\n", max_new_tokens=40,
                            **(SAMPLED_SETTINGS if sampled else
                               {"sampling": longspec.SamplingConfig(temperature=0)}))
    choice = res.choices[0]
    assert choice.text == ref.text and choice.model_extra["token_ids"] == ref.token_ids
    assert choice.finish_reason == {"eos": "stop", "stop": "stop", "length": "length"}[
        ref.finish_reason]
    assert res.usage.prompt_tokens == ref.prompt_tokens
    assert res.usage.completion_tokens == len(ref.token_ids)
    assert res.usage.total_tokens == ref.prompt_tokens + len(ref.token_ids)
    spec = res.model_extra["speculative"]
    if sampled:
        assert spec["method"] == "pld" and spec["num_drafts"] == ref.stats["steps"]
        assert spec["num_draft_tokens"] == ref.stats["drafted_tokens"]
        assert spec["num_accepted_tokens"] == ref.stats["accepted_draft_tokens"]
        assert spec["mean_acceptance_length"] == pytest.approx(ref.stats["mean_accepted_length"])


def test_chat_completion_equals_generate_on_the_messages(client, model):
    res = client.chat.completions.create(model="demo-chat", messages=MESSAGES, max_tokens=24,
                                         stop=["\n\n"], **SAMPLED)
    ref = longspec.generate(model, MESSAGES, max_new_tokens=24, stop=["\n\n"],
                            **SAMPLED_SETTINGS)
    assert res.choices[0].message.content == ref.text and res.choices[0].message.role == \
        "assistant"
    assert res.choices[0].model_extra["token_ids"] == ref.token_ids
    assert res.usage.prompt_tokens == ref.prompt_tokens and res.model_extra["seed"] == 11


def test_predicted_output_is_drafted_and_counted_in_the_usage(client, model):
    """OpenAI's `prediction`: the same tokens as without it, the usage's prediction counts
    as the OpenAI client reads them, in both endpoints; a prediction of images is refused."""
    settings = {"sampling": longspec.SamplingConfig(temperature=0), "seed": 0}
    ref = longspec.generate(model, MESSAGES, max_new_tokens=40, ignore_eos=True, **settings)
    expected = ref.text[:len(ref.text) // 2] + "\n# changed\n" + ref.text[len(ref.text) // 2:]
    usage = longspec.generate(model, MESSAGES, max_new_tokens=40, ignore_eos=True,
                              prediction=expected, **settings).stats["prediction"]
    res = client.chat.completions.create(
        model="demo-chat", messages=MESSAGES, max_tokens=40, temperature=0, seed=0,
        prediction={"type": "content", "content": [{"type": "text", "text": expected}]},
        extra_body={"ignore_eos": True, "return_token_ids": True})
    assert res.choices[0].model_extra["token_ids"] == ref.token_ids
    details = res.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == usage["accepted_tokens"] > 0
    assert details.rejected_prediction_tokens == usage["rejected_tokens"]
    # the OpenAI client's completions take no `prediction`: it goes in the body as it is
    plain = client.completions.create(model="demo-chat", prompt="import os\n", max_tokens=8,
                                      temperature=0, extra_body={"prediction": {
                                          "type": "content", "content": "import sys\n"}})
    details = plain.usage.completion_tokens_details
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
    with pytest.raises(openai.BadRequestError, match="content of type 'image_url' is not "
                       "supported"):
        client.chat.completions.create(
            model="demo-chat", messages=MESSAGES, max_tokens=4,
            prediction={"type": "content", "content": [{"type": "image_url", "text": None}]})


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_equals_non_streaming(client, model, chat):
    if chat:
        def create(**kw):
            return client.chat.completions.create(model="demo-chat", messages=MESSAGES,
                                                  max_tokens=30, **SAMPLED, **kw)
    else:
        def create(**kw):
            return client.completions.create(model="demo-chat", prompt="import os\n",
                                             max_tokens=30, **SAMPLED, **kw)
    whole = create()
    chunks = list(create(stream=True, stream_options={"include_usage": True}))
    pieces = [(c.choices[0].delta.content or "") if chat else c.choices[0].text
              for c in chunks if c.choices]
    ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
    w = whole.choices[0]
    assert "".join(pieces) == (w.message.content if chat else w.text)
    assert ids == w.model_extra["token_ids"]
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == w.finish_reason
    # a stream's first step verifies the prompt's last token alone (early_first_token): the
    # same tokens, the drafts' counts of the library's run with it
    for early, reply in ((False, whole), (True, last)):
        ref = longspec.generate(model, MESSAGES if chat else "import os\n", max_new_tokens=30,
                                early_first_token=early, **SAMPLED_SETTINGS)
        assert reply.model_extra["speculative"] == speculative(ref.stats)
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 30


def test_concurrent_clients_each_get_their_own_generation(client, model):
    results = {}

    def ask(seed):
        results[seed] = client.completions.create(
            model="demo-chat", prompt="class Parser:\n", max_tokens=16, seed=seed,
            extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0]

    threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for seed, choice in results.items():
        ref = longspec.generate(model, "class Parser:\n", max_new_tokens=16, seed=seed,
                                ignore_eos=True)
        assert choice.model_extra["token_ids"] == ref.token_ids and choice.text == ref.text
    assert len(results) == 4


GOOD = {"model": "demo-chat", "prompt": "x = 1\n", "max_tokens": 4}
CHAT = {"model": "demo-chat", "messages": MESSAGES, "max_tokens": 4}


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", {**GOOD, "max_tokens": -5}, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "max_tokens": 10**9}, 400, None),
    ("/v1/completions", {**GOOD, "max_tokens": "12"}, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {**GOOD, "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {**GOOD, "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {**GOOD, "seed": -1}, 400, "seed"),
    ("/v1/completions", {**GOOD, "stop": 5}, 400, "stop"),
    ("/v1/completions", {**GOOD, "n": 17}, 400, "n"),
    ("/v1/completions", {**GOOD, "logprobs": 6}, 400, "logprobs"),
    ("/v1/completions", {**GOOD, "tools": TOOLS}, 400, "tools"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}, 400, None),
    ("/v1/completions", {**GOOD, "model": "gpt-4o"}, 404, "model"),
    ("/v1/completions", {**GOOD, "method": "nope"}, 400, None),
    ("/v1/completions", {**GOOD, "method": "pld", "options": {"max_nodes": 0}}, 400, None),
    ("/v1/completions", {**GOOD, "prompt": ""}, 400, None),
    ("/v1/completions", {**GOOD, "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {**GOOD, "prompt": [5] * 131_073}, 400, None),
    ("/v1/completions", {"model": "demo-chat", "max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", [GOOD], 400, None),
    ("/v1/completions", b'{"model": "demo-chat", "prompt": "x"', 400, None),
    ("/v1/chat/completions", {"model": "demo-chat"}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user"}]}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 3}]}, 400,
     "messages"),
])
def test_bad_requests_get_openai_style_errors(server, path, body, status, param):
    got, _, payload = server.request("POST", path, body)
    assert got == status, payload
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    if body == {**GOOD, "prompt": [5] * 131_073}:
        assert "the prompt is too long" in err["message"]


def test_after_bad_requests_the_worker_still_serves(server, client):
    server.request("POST", "/v1/completions", b"{")
    server.request("POST", "/v1/completions", {**GOOD, "max_tokens": -1})
    res = client.completions.create(model="demo-chat", prompt="x = 1\n", max_tokens=3)
    assert res.usage.completion_tokens <= 3 and server.wait_idle() < 5


def test_unsupported_route_and_method_are_openai_errors(server):
    status, _, payload = server.request("GET", "/v1/nothing")
    assert status == 404 and payload["error"]["message"]
    status, _, payload = server.request("GET", "/v1/completions")
    assert status == 405 and payload["error"]["message"]


LONG = {"model": "demo-chat", "prompt": "def main():\n", "max_tokens": 5000, "ignore_eos": True}


def test_a_dropped_stream_cancels_its_generation_and_frees_the_worker(server, client):
    before = server.metric("longspec_generation_tokens_total")
    conn = server.open_stream(LONG)
    server.wait_running()
    conn.resp.close()
    conn.close()
    assert server.wait_idle() < 3
    res = client.completions.create(model="demo-chat", prompt="x", max_tokens=2)
    assert res.usage.completion_tokens <= 2
    assert server.metric("longspec_generation_tokens_total") - before < 2000


def test_a_dropped_stream_leaves_its_batch_and_the_others_go_on(server, client, model):
    conn = server.open_stream(LONG)
    server.wait_running()
    answer = {}

    def ask():
        answer["choice"] = client.completions.create(
            model="demo-chat", prompt="class Parser:\n", max_tokens=40, seed=7,
            extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0]

    other = threading.Thread(target=ask)
    other.start()
    time.sleep(0.3)          # the request joins the stream's batch
    conn.resp.close()
    conn.close()
    other.join()
    ref = longspec.generate(model, "class Parser:\n", max_new_tokens=40, seed=7, ignore_eos=True)
    assert answer["choice"].model_extra["token_ids"] == ref.token_ids
    assert server.wait_idle() < 3


def test_a_dropped_non_streaming_request_is_cancelled(server):
    before = server.metric("longspec_generation_tokens_total")
    with pytest.raises(TimeoutError):
        server.request("POST", "/v1/completions", LONG, timeout=1.0)
    assert server.wait_idle() < 3
    assert server.metric("longspec_generation_tokens_total") - before < 2000


def test_metrics_count_requests_tokens_and_drafts(server, client):
    names = ['longspec_requests_total{endpoint="/v1/completions",status="200"}',
             'longspec_requests_total{endpoint="/v1/completions",status="400"}',
             "longspec_generation_tokens_total", "longspec_spec_decode_num_draft_tokens_total",
             "longspec_spec_decode_num_accepted_tokens_total",
             'longspec_request_latency_seconds_count{endpoint="/v1/completions"}']
    before = [server.metric(name) for name in names]
    res = client.completions.create(model="demo-chat", prompt="import os\nimport sys\n" * 4,
                                    max_tokens=20,
                                    extra_body={"method": "pld", "ignore_eos": True})
    server.request("POST", "/v1/completions", {**GOOD, "top_p": 7})
    spec = res.model_extra["speculative"]
    assert spec["num_draft_tokens"] > 0
    assert [server.metric(name) - b for name, b in zip(names, before)] == [
        1, 1, 20, spec["num_draft_tokens"], spec["num_accepted_tokens"], 2]
    assert server.metric("longspec_queue_length") == 0


def test_a_request_starting_as_an_earlier_one_reuses_its_prompt_and_says_so(server, client,
                                                                          model):
    """The prompt cache behind the server: a second request whose prompt starts with the first
    one's prompt and answer reports those tokens as OpenAI does (usage.prompt_tokens_details.
    cached_tokens) and in /metrics, and writes what it writes with nothing cached."""
    prompt = "import os\nimport sys\n" * 6
    first = client.completions.create(model="demo-chat", prompt=prompt, max_tokens=12,
                                      temperature=0, extra_body={"ignore_eos": True})
    follow = prompt + first.choices[0].text + "\ndef main():\n"
    hits = server.metric("longspec_prefix_cache_hits_total")
    second = client.completions.create(model="demo-chat", prompt=follow, max_tokens=12,
                                       temperature=0, extra_body={"return_token_ids": True})
    cached = second.usage.prompt_tokens_details.cached_tokens
    # the prompt and the answer's tokens as far as the text, tokenized again, gives them back
    assert first.usage.prompt_tokens < cached < second.usage.prompt_tokens
    assert server.metric("longspec_prefix_cache_hits_total") - hits == cached
    assert 0 < server.metric("longspec_prefix_cache_bytes") <= server.metric(
        "longspec_prefix_cache_limit_bytes")
    model.state.prompt_cache.clear()
    fresh = longspec.generate(model, follow, max_new_tokens=12,
                              sampling=longspec.SamplingConfig(temperature=0))
    assert fresh.stats["cached_tokens"] == 0
    assert second.choices[0].model_extra["token_ids"] == fresh.token_ids


def test_load_test_script_checks_responses(server, monkeypatch, capsys):
    """benchmarks/load_test.py, run for a moment with one client (a smoke test of the script,
    not a load test)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "benchmarks"))
    import load_test

    for stream in ([], ["--stream"]):
        monkeypatch.setattr(sys, "argv", ["load_test.py", "--url", server.url, "--clients", "1",
                                          "--seconds", "0.3", "--max-tokens", "4", *stream])
        assert load_test.main() == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["ok"] >= 1 and summary["failed"] == 0
        assert summary["server_rss_bytes"]["after"] > 0 and summary["latency_s"]["p50"] > 0


ITEM_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "count"],
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "count": {"type": "integer", "minimum": 0, "maximum": 99}}}
GREEDY = {"sampling": longspec.SamplingConfig(temperature=0), "seed": 0}


class Item(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    count: int = pydantic.Field(ge=0, le=99)


def test_json_schema_response_format_equals_generate(client, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": ITEM_SCHEMA,
                                                  "strict": True}}
    res = client.chat.completions.create(model="demo-chat", messages=MESSAGES, max_tokens=64,
                                         temperature=0, seed=0, response_format=fmt,
                                         extra_body={"return_token_ids": True})
    ref = longspec.generate(model, MESSAGES, max_new_tokens=64, response_format=fmt, **GREEDY)
    assert res.choices[0].model_extra["token_ids"] == ref.token_ids
    assert res.choices[0].finish_reason == "stop"
    value = json.loads(res.choices[0].message.content)
    assert set(value) == {"name", "count"} and 0 <= value["count"] <= 99


def test_the_clients_parse_takes_a_pydantic_model(client):
    res = client.chat.completions.parse(model="demo-chat", messages=MESSAGES, max_tokens=64,
                                        temperature=0, seed=0, response_format=Item)
    item = res.choices[0].message.parsed
    assert isinstance(item, Item) and len(item.name) <= 16


def test_json_object_and_vllms_structured_outputs(client, model):
    res = client.chat.completions.create(model="demo-chat", messages=MESSAGES, max_tokens=48,
                                         temperature=0, response_format={"type": "json_object"})
    if res.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(res.choices[0].message.content), dict)
    regex = r"[a-z]{3,8}-[0-9]{2}"
    plain = client.completions.create(model="demo-chat", prompt="A code: ", max_tokens=16,
                                      temperature=0.8, seed=3,
                                      extra_body={"structured_outputs": {"regex": regex},
                                                  "return_token_ids": True})
    ref = longspec.generate(model, "A code: ", max_new_tokens=16, regex=regex, seed=3,
                            sampling=longspec.SamplingConfig(temperature=0.8))
    assert plain.choices[0].model_extra["token_ids"] == ref.token_ids
    picked = client.completions.create(model="demo-chat", prompt="Yes or no? ", max_tokens=8,
                                       extra_body={"structured_outputs": {
                                           "choice": ["yes", "no"]}})
    assert picked.choices[0].text in ("yes", "no")


@pytest.mark.parametrize("body,message", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectx"}}}}, "cannot be compiled"),
    ({"response_format": {"type": "xml"}}, "response_format must be"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "not both"),
])
def test_bad_constraints_are_refused_with_openais_error_body(server, body, message):
    status, _, payload = server.request("POST", "/v1/chat/completions", {
        "model": "demo-chat", "messages": MESSAGES, "max_tokens": 4, **body})
    assert status == 400, payload
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert message in payload["error"]["message"]


def test_n_choices_each_equal_their_seeds_request_alone(client, model):
    res = client.chat.completions.create(model="demo-chat", messages=MESSAGES, max_tokens=16,
                                         n=3, seed=7, temperature=0.9,
                                         extra_body={"return_token_ids": True})
    assert [c.index for c in res.choices] == [0, 1, 2]
    for c in res.choices:
        assert c.model_extra["seed"] == 7 + c.index
        ref = longspec.generate(model, MESSAGES, max_new_tokens=16, seed=7 + c.index,
                                sampling=longspec.SamplingConfig(temperature=0.9))
        assert c.model_extra["token_ids"] == ref.token_ids
    assert res.usage.completion_tokens == sum(len(c.model_extra["token_ids"])
                                              for c in res.choices)
    chunks = client.chat.completions.create(model="demo-chat", messages=MESSAGES, max_tokens=16,
                                            n=3, seed=7, temperature=0.9, stream=True)
    texts = ["", "", ""]
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in res.choices]


def test_logprobs_are_the_librarys(client, model):
    res = client.chat.completions.create(model="demo-chat", messages=MESSAGES, max_tokens=12,
                                         temperature=0.7, seed=3, logprobs=True, top_logprobs=2,
                                         extra_body={"method": "auto"})
    ref = longspec.generate(model, MESSAGES, max_new_tokens=12, seed=3, method="ar",
                            sampling=longspec.SamplingConfig(temperature=0.7), logprobs=2)
    content = res.choices[0].logprobs.content
    assert [t.logprob for t in content] == [lp["logprob"] for lp in ref.logprobs]
    assert all(len(t.top_logprobs) == 2 for t in content)
    plain = client.completions.create(model="demo-chat", prompt="import os\n", max_tokens=6,
                                      temperature=0, logprobs=1)
    assert len(plain.choices[0].logprobs.token_logprobs) == plain.usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_cover_the_contents_tokens_not_the_end_of_the_turn(client, model, stream):
    eos = model.tokenizer.eos_token_id
    settings = {"max_tokens": 12, "temperature": 0, "logprobs": True, "logit_bias": {eos: 100},
                "extra_body": {"min_tokens": 3}}
    ref = longspec.generate(model, MESSAGES, max_new_tokens=12, min_new_tokens=3,
                            logit_bias={eos: 100}, sampling=longspec.SamplingConfig(temperature=0),
                            logprobs=0)
    assert ref.finish_reason == "eos" and len(ref.token_ids) == 4
    res = client.chat.completions.create(model="demo-chat", messages=MESSAGES, stream=stream,
                                         **settings)
    if stream:
        chunks = list(res)
        content = [t for c in chunks for ch in c.choices if ch.logprobs
                   for t in ch.logprobs.content]
        text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    else:
        content, text = res.choices[0].logprobs.content, res.choices[0].message.content
    assert [t.logprob for t in content] == [lp["logprob"] for lp in ref.logprobs[:3]]
    assert "".join(t.token for t in content) == text == ref.text


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_parsed_by_the_client_and_taken_back(client, model, stream):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    res = client.chat.completions.create(model="demo-chat", messages=asked, max_tokens=64,
                                         temperature=0, tools=TOOLS, tool_choice=choice,
                                         stream=stream)
    if stream:
        calls, reason = {}, None
        for chunk in res:
            for c in chunk.choices:
                reason = c.finish_reason or reason
                for call in c.delta.tool_calls or []:
                    calls[call.index] = call
        calls = [calls[i] for i in sorted(calls)]
    else:
        reason, calls = res.choices[0].finish_reason, res.choices[0].message.tool_calls
    assert reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    arguments = json.loads(calls[0].function.arguments)
    assert set(arguments) <= {"city", "days"} and "city" in arguments
    ref = longspec.generate(model, asked, max_new_tokens=64, method="ar", tools=TOOLS,
                            tool_choice=choice, sampling=longspec.SamplingConfig(temperature=0))
    assert ref.finish_reason == "tool_calls"
    assert [c["function"]["arguments"] for c in ref.tool_calls] == [calls[0].function.arguments]
    # the next turn takes the call and its answer back
    turn = asked + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].id, "type": "function", "function": {
            "name": "get_weather", "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny, 21 C."}]
    answer = client.chat.completions.create(model="demo-chat", messages=turn, max_tokens=8,
                                            temperature=0, tools=TOOLS)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_auto_holds_strict_functions_arguments_and_leaves_text_free(model):
    """tool_choice auto with a `strict` function: text, then calls or none; a strict
    function's arguments follow its schema, another's any JSON object; exact under `auto`."""
    from longspec.outputs.grammar import GrammarState
    from longspec.outputs.tools import checked_tools

    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    assert checked_tools(model, TOOLS, "auto")[1] is None       # nothing strict: free
    state = GrammarState(model, checked_tools(model, strict, "auto")[1])

    def follows(text):
        return state.follows(model.tokenizer(text, add_special_tokens=False)["input_ids"])

    def call(name, arguments):
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"

    assert follows("Let me look.\n" + call("get_weather", {"city": "Paris", "days": 2}))
    assert follows("No call needed: it is sunny.")
    assert follows(call("search", {"anything": [1, 2]}))               # not strict
    assert not follows("Let me look.\n" + call("get_weather", {"town": "Paris"}))
    assert not follows(call("get_weather", {"city": "Paris"}) + "and then text")
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    settings = {"max_new_tokens": 48, "tools": strict, "tool_choice": "auto", "seed": 2,
                "sampling": longspec.SamplingConfig(temperature=0.9)}
    ar = longspec.generate(model, asked, method="ar", **settings)
    auto = longspec.generate(model, asked, method="auto", **settings)
    assert auto.token_ids == ar.token_ids


def test_tools_are_refused_for_a_model_whose_template_takes_none():
    demo = longspec.load_model("demo", dtype="float32", device="cpu")
    demo.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="takes no tools"):
        longspec.generate(demo, MESSAGES, max_new_tokens=4, tools=TOOLS)


def test_every_openai_field_is_implemented_ignored_as_neutral_or_refused(server):
    """Each field of OpenAI's chat and completions bodies (the `openai` package's typed
    parameters): a neutral value is taken; a field that would change the output and is not
    implemented is refused with a 400 naming it; none falls outside the three kinds."""
    import typing

    from openai.types import completion_create_params as completion
    from openai.types.chat import completion_create_params as chat

    from longspec.openai_api.schemas import NEUTRAL, UNSUPPORTED, ChatBody, CompletionBody

    refused = {"echo": True, "best_of": 2, "suffix": "x", "audio": {"voice": "alloy"},
               "modalities": ["text", "audio"], "functions": [{"name": "f"}],
               "function_call": {"name": "f"}, "reasoning_effort": "high",
               "verbosity": "low", "web_search_options": {}, "moderation": {"x": 1}}
    assert set(refused) == set(UNSUPPORTED)
    for params, body, path, base in (
            (chat.CompletionCreateParamsBase, ChatBody, "/v1/chat/completions",
             {"messages": MESSAGES}),
            (completion.CompletionCreateParamsBase, CompletionBody, "/v1/completions",
             {"prompt": "def f():"})):
        openai_fields = set(typing.get_type_hints(params))
        kinds = set(body.model_fields) | set(NEUTRAL) | set(UNSUPPORTED)
        assert openai_fields <= kinds, sorted(openai_fields - kinds)
        base = {"model": "demo-chat", "max_tokens": 2, **base}
        for name in sorted(openai_fields & set(NEUTRAL)):
            status, _, payload = server.request("POST", path, {**base, name: "x"})
            assert status == 200, (name, payload)
        for name in sorted(openai_fields & set(UNSUPPORTED)):
            status, _, payload = server.request("POST", path, {**base, name: refused[name]})
            assert status == 400 and payload["error"]["param"] == name, (name, payload)
            assert name in payload["error"]["message"]


def test_fields_of_no_kind_are_ignored_and_logged(server, caplog):
    with caplog.at_level("WARNING", logger="longspec.serve"):
        status, _, _ = server.request("POST", "/v1/completions", {
            "model": "demo-chat", "prompt": "x", "max_tokens": 2, "frobnicate": 3})
    assert status == 200 and "frobnicate" in caplog.text


def test_min_tokens_and_stop_token_ids_are_the_librarys(client, model):
    free = longspec.generate(model, "class Parser:\n", max_new_tokens=24, seed=3,
                             method="ar", sampling=longspec.SamplingConfig(temperature=0.8))
    stop = free.token_ids[1]
    ref = longspec.generate(model, "class Parser:\n", max_new_tokens=24, seed=3, method="ar",
                            stop=[stop], min_new_tokens=10,
                            sampling=longspec.SamplingConfig(temperature=0.8))
    res = client.completions.create(model="demo-chat", prompt="class Parser:\n", max_tokens=24,
                                    seed=3, temperature=0.8,
                                    extra_body={"min_tokens": 10, "stop_token_ids": [stop],
                                                "return_token_ids": True})
    assert res.choices[0].model_extra["token_ids"] == ref.token_ids
    assert len(ref.token_ids) >= 10 and stop not in ref.token_ids[:10]
    short = client.completions.create(model="demo-chat", prompt="class Parser:\n",
                                      max_tokens=24, seed=3, temperature=0.8,
                                      extra_body={"stop_token_ids": [stop]})
    assert short.usage.completion_tokens == 2 and short.choices[0].finish_reason == "stop"


def test_parallel_tool_calls_false_allows_one_call(model):
    from longspec.outputs.grammar import GrammarState
    from longspec.outputs.tools import checked_tools

    def call(name, arguments):
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"

    two = call("get_weather", {"city": "Paris"}) + "\n" + call("search", {"query": "x"})
    for choice in ("required", "auto"):
        many = GrammarState(model, checked_tools(model, TOOLS, choice)[1]) \
            if choice == "required" else None
        one = GrammarState(model, checked_tools(model, TOOLS, choice, parallel=False)[1])

        def follows(state, text):
            return state.follows(model.tokenizer(text, add_special_tokens=False)["input_ids"])

        assert follows(one, call("get_weather", {"city": "Paris"}))
        assert not follows(one, two)
        if many is not None:
            assert follows(many, two)
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    settings = {"max_new_tokens": 64, "tools": TOOLS, "tool_choice": "required", "seed": 2,
                "parallel_tool_calls": False, "sampling": longspec.SamplingConfig(temperature=1)}
    ar = longspec.generate(model, asked, method="ar", **settings)
    assert len(ar.tool_calls or []) <= 1
    assert longspec.generate(model, asked, method="auto", **settings).token_ids == ar.token_ids


def test_a_request_is_prepared_beside_the_worker_and_its_prompt_tokenized_once(
        server, client, monkeypatch):
    from longspec import request
    from longspec.serve import app

    threads, encoded = [], []
    prepare, encode = request.prepare_request, request.encode_prompt

    def recorded_prepare(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return prepare(*args, **kwargs)

    def recorded_encode(*args, **kwargs):
        encoded.append(1)
        return encode(*args, **kwargs)

    monkeypatch.setattr(app, "prepare_request", recorded_prepare)
    monkeypatch.setattr(request, "encode_prompt", recorded_encode)
    tiny = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
            "additionalProperties": False}
    res = client.chat.completions.create(          # no max_tokens: the rest of the context
        model="demo-chat", messages=MESSAGES, n=2, seed=5, response_format={
            "type": "json_schema", "json_schema": {"name": "tiny", "schema": tiny}})
    assert len(res.choices) == 2 and encoded == [1]
    assert len(threads) == 2 and "longspec-generate" not in threads

"""Anthropic's Messages API on `longspec serve`, with the `anthropic` package as the client: a
message, whole or streamed, is token for token the library's generation of the same chat under
speculation; tool calls come back as tool_use blocks and their results go back in; stop
sequences, token counts, errors and the API key take Anthropic's shapes."""

import http.client
import json
import typing

import anthropic
import pytest
from serving import ServerThread, demo_chat

import longspec
from longspec.anthropic_api.messages import Reply
from longspec.anthropic_api.schemas import NEUTRAL, UNSUPPORTED, MessagesBody
from longspec.anthropic_api.translate import chat_body
from longspec.api import GenerationResult
from longspec.outputs.tool_formats import FORMATS
from longspec.serve import ServeConfig, default_method

MODEL = "demo-chat"
SYSTEM = "Write Python."
ASKED = [{"role": "user", "content": "A function that parses a date."}]
CHAT = [{"role": "system", "content": SYSTEM}, *ASKED]
GREEDY = ({"temperature": 0, "return_token_ids": True},
          {"sampling": longspec.SamplingConfig(temperature=0)})
SAMPLED = ({"temperature": 0.8, "top_p": 0.9, "top_k": 50, "min_p": 0.05,
            "repetition_penalty": 1.2, "penalty_window": 32, "seed": 11, "ignore_eos": True,
            "return_token_ids": True},
           {"sampling": longspec.SamplingConfig(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05,
                                                penalty=1.2, penalty_window=32),
            "seed": 11, "ignore_eos": True})
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TOOLS = [{"name": "get_weather", "description": "The weather in a city.",
          "input_schema": WEATHER}]
FUNCTIONS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                                "description": "The weather in a city."}}]
KEY = "sesame"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = demo_chat(tmp_path_factory.mktemp("anthropic") / MODEL)
    return longspec.load_model(out, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def server(model):
    with ServerThread(model, ServeConfig(MODEL, method=default_method())) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def create(client, stream: bool, **kwargs):
    """The message, and the message_delta event's longspec fields when streamed (the SDK's
    accumulated message keeps Anthropic's fields)."""
    if not stream:
        message = client.messages.create(model=MODEL, **kwargs)
        return message, message.model_extra
    with client.messages.stream(model=MODEL, **kwargs) as events:
        texts, ends = [], []
        for e in events:
            if e.type == "content_block_delta" and e.delta.type == "text_delta":
                texts.append(e.delta.text)
            elif e.type == "message_delta":
                ends.append(e.model_extra)
        message = events.get_final_message()
    text = "".join(b.text for b in message.content if b.type == "text")
    assert "".join(texts) == text and len(ends) == 1
    return message, ends[0]


def test_a_body_is_translated_into_the_chat_body_it_stands_for():
    body = MessagesBody.model_validate({
        "model": MODEL, "max_tokens": 8, "stop_sequences": ["##"], "prediction": "x = 1",
        "system": [{"type": "text", "text": "Be brief. ", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "Write Python."}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_call_1", "name": "get_weather",
                 "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_call_1",
                 "content": [{"type": "text", "text": "Snow."}]},
                {"type": "text", "text": "And "}, {"type": "text", "text": "tomorrow?"}]}],
        "tools": TOOLS, "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
    chat = chat_body(body)
    assert [m.for_template() for m in chat.messages] == [
        {"role": "system", "content": "Be brief. Write Python."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "content": "Snow.", "tool_call_id": "call_1"},
        {"role": "user", "content": "And tomorrow?"}]
    assert chat.tools == FUNCTIONS and chat.tool_choice == "required"
    assert chat.parallel_tool_calls is False and chat.stop == ["##"]
    assert chat.max_tokens == 8 and chat.prediction.content == "x = 1"
    named = chat_body(MessagesBody.model_validate({
        "model": MODEL, "max_tokens": 8, "messages": ASKED, "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"}}))
    assert named.tool_choice == {"type": "function", "function": {"name": "get_weather"}}


def test_a_stream_holds_back_a_call_and_sends_it_as_a_tool_use_block():
    reply = Reply(MODEL, 3, None, [], FORMATS["hermes"], token_ids=False)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    pieces = ["Let me ", "look.\n<tool", call.removeprefix("<tool")]
    sent = [reply.delta(piece) for piece in pieces]
    stats = {"method": "ar", "steps": 1, "drafted_tokens": 0, "accepted_draft_tokens": 0,
             "acceptance_rate": 0.0, "mean_accepted_length": 1.0, "cached_tokens": 0}
    calls = FORMATS["hermes"].parse("".join(pieces))[1]
    events = [line for piece in [*sent, reply.end(GenerationResult(
        [1, 2], "".join(pieces), stats, "tool_calls", 5, tool_calls=calls))]
        for line in piece.splitlines() if line.startswith("data: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in events]
    assert [(e["type"], e.get("index")) for e in events] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0),
        ("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
        ("content_block_stop", 1), ("message_delta", None), ("message_stop", None)]
    assert "".join(e["delta"]["text"] for e in events[1:3]) == "Let me look.\n"
    assert events[4]["content_block"]["id"] == "toolu_" + calls[0]["id"]
    assert json.loads(events[5]["delta"]["partial_json"]) == {"city": "Oslo"}
    assert events[7]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


@pytest.mark.parametrize("stream", [False, True])
# sampled: in the slow tier, with test_endpoints_exact.py's every method sampled
@pytest.mark.parametrize("setting", [pytest.param(GREEDY, id="greedy"),
                                      pytest.param(SAMPLED, id="sampled", marks=pytest.mark.slow)])
def test_a_message_is_token_identical_to_generate_under_speculation(client, model, setting,
                                                                     stream):
    body, settings = setting
    message, extra = create(client, stream, system=SYSTEM, messages=ASKED, max_tokens=40,
                            extra_body=body)
    ref = longspec.generate(model, CHAT, max_new_tokens=40, method="ar", **settings)
    assert extra["token_ids"] == ref.token_ids
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == ref.text
    assert message.stop_reason == {"eos": "end_turn", "length": "max_tokens"}[ref.finish_reason]
    assert message.id.startswith("msg_") and message.model == MODEL and message.role == \
        "assistant"
    usage = message.usage
    assert usage.output_tokens == len(ref.token_ids)
    assert usage.input_tokens + usage.cache_read_input_tokens == ref.prompt_tokens
    assert extra["speculative"]["method"] == default_method()
    assert extra["seed"] == body.get("seed", extra["seed"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_is_the_librarys_turn_for_turn(client, model, stream):
    choice = {"type": "tool", "name": "get_weather"}
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    greedy = {"method": "ar", "sampling": longspec.SamplingConfig(temperature=0)}
    message, extra = create(client, stream, messages=asked, tools=TOOLS, tool_choice=choice,
                            max_tokens=48, extra_body=GREEDY[0])
    ref = longspec.generate(model, asked, max_new_tokens=48, tools=FUNCTIONS,
                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                            **greedy)
    assert extra["token_ids"] == ref.token_ids and message.stop_reason == "tool_use"
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert isinstance(use, anthropic.types.ToolUseBlock) and use.name == "get_weather"
    assert use.id.startswith("toolu_") and use.input == json.loads(
        ref.tool_calls[0]["function"]["arguments"])
    # the call and its result go back: the template sees what the OpenAI form gives it
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                           "content": "Sunny, 21 C."}]}
    message, extra = create(client, stream, messages=[*asked, {"role": "assistant",
                                                               "content": message.content},
                                                      answer],
                            tools=TOOLS, max_tokens=24, extra_body=GREEDY[0])
    call_id = use.id.removeprefix("toolu_")
    turn = [*asked, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 C."}]
    ref = longspec.generate(model, turn, max_new_tokens=24, tools=FUNCTIONS, **greedy)
    assert extra["token_ids"] == ref.token_ids


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_ends_the_message_and_is_named(client, model, stream):
    body, settings = SAMPLED
    free = longspec.generate(model, CHAT, max_new_tokens=40, method="ar", **settings)
    # a piece of the text that first occurs after some of it
    stop = next(free.text[k:k + 3] for k in range(8, 30)
                if free.text.find(free.text[k:k + 3]) == k and free.text[k:k + 3].strip())
    ref = longspec.generate(model, CHAT, max_new_tokens=40, method="ar", stop=["@@@", stop],
                            **settings)
    assert ref.finish_reason == "stop" and ref.text
    message, extra = create(client, stream, system=SYSTEM, messages=ASKED, max_tokens=40,
                            stop_sequences=["@@@", stop], extra_body=body)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == ref.text and extra["token_ids"] == ref.token_ids


def test_count_tokens_is_the_prompt_the_message_reads(client):
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    count = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=asked,
                                         tools=TOOLS).input_tokens
    message = client.messages.create(model=MODEL, system=SYSTEM, messages=asked, tools=TOOLS,
                                     max_tokens=2)
    assert count == message.usage.input_tokens + message.usage.cache_read_input_tokens
    # tool_choice none sends no tools to the template
    assert client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=asked,
                                        tools=TOOLS, tool_choice={"type": "none"}
                                        ).input_tokens < count


def test_every_anthropic_field_is_implemented_neutral_or_refused(server):
    from anthropic.types import message_create_params

    fields = set(typing.get_type_hints(message_create_params.MessageCreateParamsBase))
    assert fields <= set(MessagesBody.model_fields) | set(NEUTRAL) | set(UNSUPPORTED)
    base = {"model": MODEL, "messages": ASKED}
    for name in sorted(fields & set(NEUTRAL)):
        status, _, payload = server.request("POST", "/v1/messages/count_tokens",
                                            {**base, name: {"x": 1}})
        assert status == 200, (name, payload)
    for name, value in (("thinking", {"type": "enabled", "budget_tokens": 1024}),
                        ("mcp_servers", [{"type": "url"}]), ("context_management", {})):
        status, _, payload = server.request("POST", "/v1/messages/count_tokens",
                                            {**base, name: value})
        assert status == 400 and name in payload["error"]["message"], (name, payload)


@pytest.mark.parametrize("body, says", [
    ({"messages": ASKED}, "max_tokens"),
    ({"messages": ASKED, "max_tokens": 4, "temperature": 1.5}, "temperature"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": ""}}]}], "max_tokens": 4},
     "'image'"),
    ({"messages": ASKED, "max_tokens": 4, "tools": [
        {"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
    ({"messages": ASKED, "max_tokens": 4, "output_config": {"effort": "high"}}, "effort"),
    ({"messages": [*ASKED, {"role": "assistant", "content": "def"}], "max_tokens": 4},
     "prefill"),
])
def test_bad_bodies_get_anthropics_error_body(server, body, says):
    status, _, payload = server.request("POST", "/v1/messages", {"model": MODEL, **body})
    assert status == 400 and payload["type"] == "error", payload
    assert payload["error"]["type"] == "invalid_request_error"
    assert says in payload["error"]["message"]


def test_the_sdk_raises_its_typed_errors(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, messages=ASKED, max_tokens=4,
                               extra_body={"temperature": 1.5})
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", messages=ASKED, max_tokens=4)
    assert e.value.body == {"type": "error", "error": {
        "type": "not_found_error", "message": e.value.body["error"]["message"]}}
    assert "no-such-model" in e.value.body["error"]["message"]


def test_the_api_key_is_taken_as_x_api_key_or_bearer(model):
    count = {"model": MODEL, "messages": ASKED}
    with ServerThread(model, ServeConfig(MODEL, api_key=KEY)) as s:
        assert s.request("POST", "/v1/messages/count_tokens", count, {"x-api-key": KEY})[0] == 200
        right = anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0)
        assert right.messages.count_tokens(**count).input_tokens > 0
        wrong = anthropic.Anthropic(base_url=s.url, api_key="guess", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as e:
            wrong.messages.count_tokens(**count)
        assert e.value.body["error"]["type"] == "authentication_error"
        status, _, body = s.request("POST", "/v1/messages", count)
        assert status == 401 and "missing" in body["error"]["message"]


def test_a_timeout_is_anthropics_error_whole_and_an_error_event_streamed(model):
    body = {"model": MODEL, "messages": ASKED, "max_tokens": 8}
    with ServerThread(model, ServeConfig(MODEL, request_timeout=0.0)) as s:
        status, _, payload = s.request("POST", "/v1/messages", body)
        assert status == 504 and payload["error"]["type"] == "timeout_error"
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/messages", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        lines = [line.decode().strip() for line in conn.getresponse() if line.strip()]
        conn.close()
    assert lines[0] == "event: message_start" and lines[-2] == "event: error"
    assert json.loads(lines[-1].removeprefix("data: "))["error"]["type"] == "timeout_error"

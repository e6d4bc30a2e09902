"""OpenAI's Responses API on `longspec serve`, with the `openai` package (and, in the slow tier,
the OpenAI Agents SDK) as the client: a response, whole or streamed, is token-identical to the
library's plain decoding of the chat messages it stands for, under the server's speculative
method; `parse` holds it to a pydantic model; a function-call loop continues the same way from
its full input or from a stored response; what longspec cannot honour is refused by name."""

import asyncio
import typing

import openai
import pydantic
import pytest
from serving import ServerThread, demo_chat

import longspec
from longspec.openai_api.responses_schema import NEUTRAL, UNSUPPORTED, ResponsesBody
from longspec.serve import ServeConfig, default_method

INSTRUCTIONS = "Write Python."
ASK = "A function that parses a date."
MESSAGES = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": ASK}]
GREEDY = ({"temperature": 0, "extra_body": {"seed": 0, "return_token_ids": True}},
          {"sampling": longspec.SamplingConfig(temperature=0), "seed": 0})
SAMPLED = ({"temperature": 0.8, "top_p": 0.9,
            "extra_body": {"seed": 11, "min_p": 0.05, "top_k": 50, "repetition_penalty": 1.2,
                           "penalty_window": 32, "ignore_eos": True, "return_token_ids": True}},
           {"sampling": longspec.SamplingConfig(temperature=0.8, top_p=0.9, min_p=0.05, top_k=50,
                                                penalty=1.2, penalty_window=32),
            "seed": 11, "ignore_eos": True})
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"type": "string", "maxLength": 12}}}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}


class Tally(pydantic.BaseModel):
    count: int = pydantic.Field(ge=0, le=99)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = demo_chat(tmp_path_factory.mktemp("responses") / "demo-chat")
    return longspec.load_model(out, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def server(model):
    with ServerThread(model, ServeConfig("demo-chat", method=default_method())) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


def streamed(events) -> tuple[str, object]:
    """The text of a stream's deltas and its last event, its events numbered in order."""
    events = list(events)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    return "".join(e.delta for e in events if e.type == "response.output_text.delta"), events[-1]


# sampled: in the slow tier, with test_endpoints_exact.py's every method sampled
@pytest.mark.parametrize("settings", [pytest.param(GREEDY, id="greedy"),
                                      pytest.param(SAMPLED, id="sampled", marks=pytest.mark.slow)])
def test_a_response_whole_or_streamed_is_plain_decodings_under_speculation(client, model,
                                                                           settings):
    asked, library = settings
    ref = longspec.generate(model, MESSAGES, max_new_tokens=40, method="ar", **library)
    whole = client.responses.create(model="demo-chat", instructions=INSTRUCTIONS, input=ASK,
                                    max_output_tokens=40, **asked)
    assert whole.model_extra["token_ids"] == ref.token_ids and whole.output_text == ref.text
    assert whole.model_extra["speculative"]["method"] == default_method() != "ar"
    assert whole.usage.input_tokens == ref.prompt_tokens
    assert whole.usage.output_tokens == len(ref.token_ids)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.id.startswith("resp_") and whole.output[0].id.startswith("msg_")
    text, last = streamed(client.responses.create(
        model="demo-chat", instructions=INSTRUCTIONS, input=ASK, max_output_tokens=40,
        stream=True, **asked))
    assert text == ref.text and last.type == "response.incomplete"
    assert last.response.model_extra["token_ids"] == ref.token_ids
    assert last.response.output_text == ref.text


def test_parse_holds_the_output_to_a_pydantic_model_as_generate_does(client, model):
    res = client.responses.parse(model="demo-chat", instructions=INSTRUCTIONS, input=ASK,
                                 text_format=Tally, max_output_tokens=48, temperature=0,
                                 extra_body={"seed": 0, "return_token_ids": True})
    assert res.status == "completed" and isinstance(res.output_parsed, Tally)
    fmt = res.model_dump(by_alias=True)["text"]["format"]       # the schema the client sent
    ref = longspec.generate(model, MESSAGES, max_new_tokens=48, method="ar", **GREEDY[1],
                            response_format={"type": "json_schema", "json_schema": {
                                "name": fmt["name"], "schema": fmt["schema"], "strict": True}})
    assert res.model_extra["token_ids"] == ref.token_ids and res.output_text == ref.text
    # the client's stream accumulates the events into the same parsed response
    with client.responses.stream(model="demo-chat", instructions=INSTRUCTIONS, input=ASK,
                                 text_format=Tally, max_output_tokens=48, temperature=0,
                                 extra_body={"seed": 0}) as stream:
        final = stream.get_final_response()
    assert final.output_parsed == res.output_parsed and final.output_text == res.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_loop_goes_on_alike_from_its_input_or_its_stored_response(
        client, model, stream):
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(model="demo-chat", input=asked, tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    max_output_tokens=48, temperature=0, stream=stream)
    if stream:
        first = streamed(first)[1].response
    assert first.status == "completed" and [o.type for o in first.output] == ["function_call"]
    call = first.output[0]
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    ref = longspec.generate(model, asked, max_new_tokens=48, method="ar", tools=[CHAT_WEATHER],
                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                            sampling=longspec.SamplingConfig(temperature=0))
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in ref.tool_calls] == \
        [(call.name, call.arguments)]
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."}
    turn = {"model": "demo-chat", "tools": [WEATHER], "max_output_tokens": 12, "temperature": 0,
            "extra_body": {"return_token_ids": True, "seed": 0}}
    full = client.responses.create(input=[*asked, *first.output, answer], **turn)
    chained = client.responses.create(previous_response_id=first.id, input=[answer], **turn)
    assert full.model_extra["token_ids"] == chained.model_extra["token_ids"]
    assert full.usage.input_tokens == chained.usage.input_tokens
    messages = asked + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function",
         "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C."}]
    ref = longspec.generate(model, messages, max_new_tokens=12, method="ar", tools=[CHAT_WEATHER],
                            **GREEDY[1])
    assert chained.model_extra["token_ids"] == ref.token_ids
    assert chained.usage.input_tokens == ref.prompt_tokens


def test_stored_responses_are_read_deleted_and_continued_only_while_kept(client, server):
    kept = client.responses.create(model="demo-chat", input=ASK, max_output_tokens=4)
    assert client.responses.retrieve(kept.id).output_text == kept.output_text
    unkept = client.responses.create(model="demo-chat", input=ASK, max_output_tokens=4,
                                     store=False)
    client.responses.delete(kept.id)
    for gone in (unkept.id, kept.id, "resp_nothing"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="demo-chat", input="And?", max_output_tokens=4,
                                    previous_response_id=gone)
        assert refused.value.body["param"] == "previous_response_id"
        assert refused.value.body["code"] == "previous_response_not_found"
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone)


BASE = {"model": "demo-chat", "input": ASK, "max_output_tokens": 4}


@pytest.mark.parametrize("fields,param,named", [
    ({"tools": [{"type": "web_search"}]}, "tools", "web_search"),
    ({"tools": [WEATHER, {"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools",
     "code_interpreter"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice", "file_search"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "reasoning"),
    ({"background": True}, "background", "background"),
    ({"conversation": "conv_1"}, "conversation", "conversation"),
    ({"include": ["file_search_call.results"]}, "include", "include"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input", "input_image"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input", "reasoning"),
    ({"text": {"format": {"type": "xml"}}}, "text.format", "text.format"),
    ({"min_p": 5}, "min_p", "min_p"),
    ({"input": None}, "input", "input"),
])
def test_what_longspec_cannot_honour_is_refused_naming_it(server, fields, param, named):
    status, _, payload = server.request("POST", "/v1/responses", {**BASE, **fields})
    assert status == 400, payload
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["param"] == param and named in payload["error"]["message"]


def test_every_field_is_implemented_ignored_as_neutral_or_refused(server):
    """Each field of the `openai` package's typed Responses body: a neutral value is taken;
    one that would change the output and is not implemented is refused with a 400 naming it."""
    from openai.types.responses import response_create_params as params

    refused = {"background": True, "conversation": "conv_1", "prompt": {"id": "pmpt_1"},
               "context_management": [{"type": "compaction"}], "moderation": {"model": "m"},
               "truncation": "auto", "include": ["reasoning.encrypted_content"],
               "top_logprobs": 2}
    assert set(refused) == set(UNSUPPORTED)
    fields = set(typing.get_type_hints(params.ResponseCreateParamsBase))
    assert fields <= set(ResponsesBody.model_fields) | set(NEUTRAL) | set(UNSUPPORTED), \
        sorted(fields - set(ResponsesBody.model_fields) - set(NEUTRAL) - set(UNSUPPORTED))
    for name in sorted(fields & set(NEUTRAL)):
        status, _, payload = server.request("POST", "/v1/responses", {**BASE, name: "x"})
        assert status == 200, (name, payload)
    for name in sorted(fields & set(UNSUPPORTED)):
        status, _, payload = server.request("POST", "/v1/responses", {**BASE, name: refused[name]})
        assert status == 400 and payload["error"]["param"] == name, (name, payload)


@pytest.mark.slow
def test_the_openai_agents_sdk_runs_a_tool_loop_against_the_server(server):
    """An agent with a function tool, on the SDK's Responses model: its first turn held to a
    call (tool_choice required), then, the tool's answer sent back, its output held to the
    agent's output type (text.format); two model turns, the tool called once."""
    import agents

    class Verdict(pydantic.BaseModel):
        sunny: bool

    called = []

    @agents.function_tool(strict_mode=False)
    def get_weather(city: str) -> str:
        """The weather in a city."""
        called.append(city)
        return "Sunny, 21 C."

    agents.set_tracing_disabled(True)
    llm = agents.OpenAIResponsesModel("demo-chat", openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0))
    agent = agents.Agent(name="weather", instructions="Answer with the weather.",
                         tools=[get_weather], model=llm, output_type=Verdict,
                         model_settings=agents.ModelSettings(tool_choice="required",
                                                             temperature=0, max_tokens=48))
    result = asyncio.run(agents.Runner.run(agent, "Is it sunny in Paris?", max_turns=3))
    assert len(called) == 1 and len(result.raw_responses) == 2
    assert isinstance(result.final_output, Verdict)

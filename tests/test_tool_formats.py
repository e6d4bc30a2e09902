"""Tool calls in every registered format (outputs/tool_formats.py): each format recognised from a
chat template of its family, its calls parsed back, its stream held back where a call may
begin, its grammar forcing the calls' syntax and schema; and, served with a Llama-3-style and a
Mistral-style template on tiny models, calls the OpenAI client parses (tool_choice required and
auto), token for token those of plain decoding."""

import json

import openai
import pytest
from serving import ServerThread, demo_chat

import longspec
from longspec.outputs.grammar import GrammarState
from longspec.outputs.tool_formats import FORMATS
from longspec.outputs.tools import checked_tools, tool_format
from longspec.serve import ServeConfig

SPECIAL = 8191      # the demo vocabulary's last id, made a special token by a template's model
LLAMA3 = (
    "{% if tools %}<|endoftext|>system\nGiven the following functions, please respond with a "
    "JSON for a function call with its proper arguments.\nRespond in the format {\"name\": "
    "function name, \"parameters\": dictionary of argument name and its value}.\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}<|endoftext|>{{ 'ipython' if m['role'] == 'tool' else m['role'] }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}{\"name\": \"{{ c.function.name }}\", "
    "\"parameters\": {{ c.function.arguments | tojson }}}{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")
MISTRAL = (
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
    "{% if c.id | length != 9 %}{{ raise_exception('tool call ids have 9 characters') }}"
    "{% endif %}{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}, \"id\": \"{{ c.id }}\"}"
    "{% if not loop.last %}, {% endif %}{% endfor %}]<|endoftext|>"
    "{% elif m['role'] == 'tool' %}[TOOL_RESULTS]{\"call_id\": \"{{ m.tool_call_id }}\", "
    "\"content\": {{ m['content'] | tojson }}}[/TOOL_RESULTS]"
    "{% else %}{{ m['content'] }}<|endoftext|>{% endif %}{% endfor %}")
PYTHONIC = (
    "{% if tools %}<|endoftext|>system\nCall functions as [func_name1(params_name1="
    "params_value1, params_name2=params_value2...), func_name2(params)].\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")
HERMES = "{% if tools %}Call one as <tool_call>{...}</tool_call>{% endif %}{{ messages }}"
TEMPLATES = {"llama3_json": LLAMA3, "mistral": MISTRAL, "pythonic": PYTHONIC, "hermes": HERMES}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "strict": True,
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "required": ["query"],
        "properties": {"query": {"type": "string", "maxLength": 16}}}}}]
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]
# each format's writing of: get_weather(city="Paris", days=2), then search(query="rain")
WRITTEN = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
              '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"query": "rain"}}\n'
              "</tool_call>",
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
               ', {"name": "search", "arguments": {"query": "rain"}}]',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
                   '{"name": "search", "parameters": {"query": "rain"}}',
    "pythonic": '[get_weather(city="Paris", days=2), search(query="rain")]',
}


def chat_model(tmp_path_factory, template: str, special: str | None = None):
    """The demo model with this chat template; `special`: a marker the vocabulary holds as one
    special token (as Mistral's holds [TOOL_CALLS])."""
    out = demo_chat(tmp_path_factory.mktemp("formats") / "chat", template)
    if special is not None:     # the last id's token (the last merge's) gives its id up
        tok = json.loads((out / "tokenizer.json").read_text())
        bpe = tok["model"]
        last = next(text for text, i in bpe["vocab"].items() if i == SPECIAL)
        del bpe["vocab"][last]
        bpe["merges"] = [m for m in bpe["merges"] if "".join(m) != last]
        tok["added_tokens"].append({"id": SPECIAL, "content": special, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False,
                                    "special": True})
        (out / "tokenizer.json").write_text(json.dumps(tok))
    return longspec.load_model(out, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return chat_model(tmp_path_factory, LLAMA3)


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return chat_model(tmp_path_factory, MISTRAL, special="[TOOL_CALLS]")


@pytest.fixture(scope="module")
def pythonic(tmp_path_factory):
    return chat_model(tmp_path_factory, PYTHONIC)


class Named:
    def __init__(self, template):
        self.name, self.tokenizer = "m", type("T", (), {"chat_template": template})()


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_each_family_template_is_recognised_and_a_named_format_wins(name):
    assert tool_format(Named(TEMPLATES[name])).name == name
    assert tool_format(Named(TEMPLATES[name]), "hermes").name == "hermes"
    with pytest.raises(ValueError, match="no format longspec recognises.*hermes"):
        tool_format(Named("{% if tools %}{{ tools }}{% endif %}"))
    with pytest.raises(ValueError, match="tool_format must be one of"):
        tool_format(Named(TEMPLATES[name]), "xml")


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_each_format_parses_its_calls_back_and_leaves_other_text(name):
    fmt = FORMATS[name]
    content, calls = fmt.parse(WRITTEN[name])
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("search", {"query": "rain"})]
    assert len({c["id"] for c in calls}) == 2
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls) == (name == "mistral")
    assert fmt.parse("It is sunny.") == ("It is sunny.", [])
    broken = WRITTEN[name][:-3]
    assert fmt.parse(broken)[1] == [] or name == "hermes"      # Hermes keeps the whole block
    # a stream holds back from where a call may begin, and lets text go
    assert fmt.held_back(WRITTEN[name]) < len(WRITTEN[name])
    assert fmt.held_back("It is sunny.") == len("It is sunny.")


@pytest.mark.parametrize("name", ["llama3_json", "mistral", "pythonic"])
def test_each_formats_grammar_forces_the_calls_and_their_schema(name, llama, mistral,
                                                                 pythonic):
    model = {"llama3_json": llama, "mistral": mistral, "pythonic": pythonic}[name]

    def follows(choice, text, parallel=True):
        state = GrammarState(model, checked_tools(model, TOOLS, choice, parallel)[1])
        return state.follows(model.tokenizer(text, add_special_tokens=False)["input_ids"])

    one = {"llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
           "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
           "pythonic": '[get_weather(city="Paris")]'}[name]
    bad = one.replace("city", "town")
    assert follows("required", WRITTEN[name]) and follows("required", one)
    assert not follows("required", bad) and not follows("required", "It is sunny.")
    assert follows("required", one, parallel=False)
    assert not follows("required", WRITTEN[name], parallel=False)
    named = {"type": "function", "function": {"name": "search"}}
    assert not follows(named, one)
    assert follows("auto", "It is sunny.") and follows("auto", one)     # get_weather is strict
    if name != "pythonic":       # pythonic holds argument names, not values, to the schema
        assert not follows("auto", one.replace('"Paris"', '"Paris is too long"'))


@pytest.fixture(scope="module", params=["llama", "mistral"])
def served(request):
    model = request.getfixturevalue(request.param)
    with ServerThread(model, ServeConfig("chat", method="auto")) as server:
        yield model, openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                                   timeout=120)


# under auto, a bias on the token that begins a call (Llama's "{", Mistral's [TOOL_CALLS])
# makes the model write one
BEGINS = {"llama3_json": 91, "mistral": SPECIAL}


@pytest.mark.parametrize("choice", ["required", "auto"])
@pytest.mark.parametrize("sampled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_served_calls_are_parsed_by_the_client_and_equal_plain_decoding(served, choice,
                                                                        sampled):
    model, client = served
    fmt = tool_format(model)
    bias = {BEGINS[fmt.name]: 100} if choice == "auto" else None
    tools = TOOLS[:1] if choice == "auto" else TOOLS    # auto holds strict functions alone
    sampling = {"temperature": 0.8, "top_p": 0.9} if sampled else {"temperature": 0}
    res = client.chat.completions.create(
        model="chat", messages=ASKED, tools=tools, tool_choice=choice, max_tokens=64, seed=3,
        logit_bias=bias, parallel_tool_calls=False, extra_body={"return_token_ids": True},
        **sampling)
    ref = longspec.generate(model, ASKED, tools=tools, tool_choice=choice, max_new_tokens=64,
                            seed=3, logit_bias=bias, parallel_tool_calls=False, method="ar",
                            sampling=longspec.SamplingConfig(**sampling))
    choice0 = res.choices[0]
    assert choice0.model_extra["token_ids"] == ref.token_ids
    assert choice0.finish_reason == "tool_calls" and len(choice0.message.tool_calls) == 1
    calls = choice0.message.tool_calls
    assert [c.function.arguments for c in calls] == [c["function"]["arguments"]
                                                     for c in ref.tool_calls]
    assert all(c.function.name in ("get_weather", "search") for c in calls)
    # the next turn takes the calls and their answers back through the template
    turn = ASKED + [{"role": "assistant", "content": None, "tool_calls": [
        c.model_dump(include={"id", "type", "function"}) for c in calls]}] + [
        {"role": "tool", "tool_call_id": c.id, "content": "Sunny, 21 C."} for c in calls]
    answer = client.chat.completions.create(model="chat", messages=turn, max_tokens=8,
                                            temperature=0, tools=TOOLS)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_streamed_call_is_held_back_from_the_text_and_sent_whole(served):
    model, client = served
    chunks = client.chat.completions.create(
        model="chat", messages=ASKED, tools=TOOLS, tool_choice="required", max_tokens=64,
        temperature=0, parallel_tool_calls=False, stream=True)
    text, calls, reason = "", [], None
    for chunk in chunks:
        delta = chunk.choices[0].delta
        text += delta.content or ""
        calls += delta.tool_calls or []
        reason = chunk.choices[0].finish_reason or reason
    ref = longspec.generate(model, ASKED, tools=TOOLS, tool_choice="required",
                            max_new_tokens=64, parallel_tool_calls=False, method="ar",
                            sampling=longspec.SamplingConfig(temperature=0))
    assert text == "" and reason == "tool_calls"
    assert [c.function.arguments for c in calls] == [c["function"]["arguments"]
                                                     for c in ref.tool_calls]

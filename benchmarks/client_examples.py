"""The client examples of docs/server.md against a running server, each token-checked against `ar`.

Runs the pasteable examples of docs/server.md's "Anthropic's Messages API" (the `anthropic`
client: messages.create whole, streamed, and a tool loop of two turns), "OpenAI's Responses API"
(the `openai` client: responses.create, responses.parse, responses.stream, and the OpenAI
Agents SDK example) and "Tool calls" (chat completions with tools), with their requests as the
docs write them. Each request is sent twice: as written (the server's method, or the one it
names), then again with `method: "ar"` (plain decoding), both with `return_token_ids`, which
only adds the token ids to the answer. The two runs' tokens must be equal. Where an example
samples without a seed, both runs get `seed` 1 (the line's `note` says so); a second turn sends
the first turn's answer (as the server wrote it) to both runs. The Agents SDK example is checked
to run and call its tool, without an `ar` run (its requests are the SDK's).

One JSON line per example: name, ok (it ran as written and answered what it asks for),
identical (its tokens equal `ar`'s), tokens, seconds (the run as written), an excerpt of the
text; all the lines go to `--out` too.

    longspec serve qwen-coder-1.5b --port 8000
    python benchmarks/client_examples.py --out docs/benchmarks/client-examples-2026-12-03.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import anthropic
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel

MODEL = "qwen-coder-1.5b"
SEED = 1
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "The weather in a city now",
                    "input_schema": {"type": "object", "required": ["city"],
                                     "properties": {"city": {"type": "string"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string"}}}}}]


class Novel(BaseModel):
    title: str
    year: int


class Examples:
    """Each example: a method taking the extra body fields of one run and returning the run's
    token ids, its text and whether it answered what the example asks for."""

    def __init__(self, url: str):
        self.url = url
        self.anthropic = anthropic.Anthropic(base_url=url, api_key="none")
        self.openai = OpenAI(base_url=url + "/v1", api_key="none")
        self.turns: dict[str, list] = {}        # an example's second turn, built from its first

    # -- Anthropic's Messages API ----------------------------------------------------------------

    def anthropic_create(self, extra):
        msg = self.anthropic.messages.create(
            model=MODEL, max_tokens=200, system="Answer briefly.",
            messages=[{"role": "user", "content": "What is a decorator?"}],
            extra_body={"temperature": 0, "method": "pld", **extra})
        text = msg.content[0].text
        return msg.model_extra["token_ids"], text, bool(text) and "speculative" in msg.model_extra

    def anthropic_stream(self, extra):
        pieces, ids = [], None
        with self.anthropic.messages.stream(model=MODEL, max_tokens=200, messages=[
                {"role": "user", "content": "What does a Python generator do? Answer briefly."}],
                extra_body=extra) as stream:
            for event in stream:
                if event.type == "text":
                    pieces.append(event.text)
                elif event.type == "message_delta":
                    ids = event.model_extra["token_ids"]
        return ids, "".join(pieces), bool(pieces)

    def anthropic_tools_1(self, extra):
        msg = self.anthropic.messages.create(model=MODEL, max_tokens=100, messages=ASKED,
                                             tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"},
                                             extra_body={"temperature": 0, **extra})
        use = next(b for b in msg.content if b.type == "tool_use")
        self.turns.setdefault("anthropic", ASKED + [
            {"role": "assistant", "content": msg.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "Sunny, 21 C."}]}])
        return msg.model_extra["token_ids"], f"{use.name} {use.input}", use.name == "get_weather"

    def anthropic_tools_2(self, extra):
        msg = self.anthropic.messages.create(model=MODEL, max_tokens=100,
                                             messages=self.turns["anthropic"],
                                             tools=ANTHROPIC_TOOLS, tool_choice={"type": "none"},
                                             extra_body={"temperature": 0, **extra})
        text = msg.content[0].text
        return msg.model_extra["token_ids"], text, msg.content[0].type == "text" and bool(text)

    # -- OpenAI's Responses API ------------------------------------------------------------------

    def responses_create(self, extra):
        res = self.openai.responses.create(
            model=MODEL, instructions="Answer briefly.", input="What does a Python decorator do?",
            max_output_tokens=200, temperature=0.7,
            extra_body={"seed": 1, "min_p": 0.05, **extra})
        ok = bool(res.output_text) and res.usage is not None and "speculative" in res.model_extra
        return res.model_extra["token_ids"], res.output_text, ok

    def responses_parse(self, extra):
        parsed = self.openai.responses.parse(model=MODEL, input="A classic novel, as JSON.",
                                             text_format=Novel, temperature=0,
                                             max_output_tokens=200, extra_body=extra)
        novel = parsed.output_parsed
        return parsed.model_extra["token_ids"], repr(novel), isinstance(novel, Novel)

    def responses_stream(self, extra):
        pieces = []
        with self.openai.responses.stream(model=MODEL, input="Write a haiku about caches.",
                                          max_output_tokens=200, extra_body=extra) as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    pieces.append(event.delta)
            final = stream.get_final_response()
        text = "".join(pieces)
        return final.model_extra["token_ids"], text, bool(text) and text == final.output_text

    def agents(self):
        from agents import (
            Agent,
            ModelSettings,
            OpenAIResponsesModel,
            Runner,
            ToolCallItem,
            function_tool,
            set_tracing_disabled,
        )

        @function_tool
        def get_weather(city: str) -> str:
            """The weather in a city now."""
            return "Sunny, 21 C."

        set_tracing_disabled(True)
        model = OpenAIResponsesModel(MODEL, AsyncOpenAI(base_url=self.url + "/v1",
                                                        api_key="none"))
        agent = Agent(name="weather", tools=[get_weather], model=model,
                      instructions="Call a tool once, then answer the user in a sentence.",
                      model_settings=ModelSettings(temperature=0, max_tokens=300,
                                                   tool_choice="required"))
        result = asyncio.run(Runner.run(agent, "What is the weather in Paris?"))
        called = [i for i in result.new_items if isinstance(i, ToolCallItem)]
        tokens = sum(r.usage.output_tokens for r in result.raw_responses)
        return tokens, str(result.final_output), bool(called) and bool(result.final_output)

    # -- Tool calls (chat completions) -----------------------------------------------------------

    def chat_tools_1(self, extra):
        res = self.openai.chat.completions.create(model=MODEL, messages=ASKED, tools=CHAT_TOOLS,
                                                  tool_choice="required", temperature=0,
                                                  max_tokens=100, extra_body=extra)
        call = res.choices[0].message.tool_calls[0]
        self.turns.setdefault("chat", ASKED + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name,
                              "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."}])
        text = f"{call.function.name} {call.function.arguments}"
        return res.choices[0].model_extra["token_ids"], text, call.function.name == "get_weather"

    def chat_tools_2(self, extra):
        res = self.openai.chat.completions.create(model=MODEL, messages=self.turns["chat"],
                                                  tools=CHAT_TOOLS, tool_choice="none",
                                                  temperature=0, max_tokens=100, extra_body=extra)
        text = res.choices[0].message.content
        return res.choices[0].model_extra["token_ids"], text, bool(text)


# name, method, whether the example samples without a seed (both runs then get SEED)
EXAMPLES = [
    ("anthropic.messages.create", "anthropic_create", False),
    ("anthropic.messages.stream", "anthropic_stream", True),
    ("anthropic.tool_loop.turn1", "anthropic_tools_1", False),
    ("anthropic.tool_loop.turn2", "anthropic_tools_2", False),
    ("openai.responses.create", "responses_create", False),
    ("openai.responses.parse", "responses_parse", False),
    ("openai.responses.stream", "responses_stream", True),
    ("chat.tool_calls.turn1", "chat_tools_1", False),
    ("chat.tool_calls.turn2", "chat_tools_2", False),
]


def excerpt(text: str | None, n: int = 100) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[:n] + "..."


def check(examples: Examples, name: str, method: str, seeded: bool) -> dict:
    run = getattr(examples, method)
    extra = {"return_token_ids": True, **({"seed": SEED} if seeded else {})}
    line = {"name": name, "ok": False, "identical": None, "tokens": None, "seconds": None}
    if seeded:
        line["note"] = f"samples without a seed: seed {SEED} added to both runs"
    try:
        start = time.perf_counter()
        ids, text, ok = run(extra)
        line.update(ok=ok, tokens=len(ids), seconds=round(time.perf_counter() - start, 2),
                    text=excerpt(text))
    except Exception as e:      # noqa: BLE001 - the line reports it
        return {**line, "error": f"{type(e).__name__}: {e}"[:500]}
    try:
        start = time.perf_counter()
        ar_ids, _, _ = run({**extra, "method": "ar"})
        line.update(identical=ar_ids == ids, ar_seconds=round(time.perf_counter() - start, 2))
    except Exception as e:      # noqa: BLE001
        line["error"] = f"ar run: {type(e).__name__}: {e}"[:500]
    return line


def check_agents(examples: Examples) -> dict:
    line = {"name": "openai.agents", "ok": False, "identical": None, "tokens": None,
            "seconds": None, "note": "runs and calls its tool; no ar run (the SDK's requests)"}
    try:
        start = time.perf_counter()
        tokens, text, ok = examples.agents()
        line.update(ok=ok, tokens=tokens, seconds=round(time.perf_counter() - start, 2),
                    text=excerpt(text))
    except Exception as e:      # noqa: BLE001
        line["error"] = f"{type(e).__name__}: {e}"[:500]
    return line


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--out", help="a .jsonl file for the lines")
    parser.add_argument("--only", nargs="*", help="the examples to run, by name")
    args = parser.parse_args()
    examples = Examples(args.url.rstrip("/"))
    lines = []
    for name, method, seeded in EXAMPLES + [("openai.agents", None, False)]:
        if args.only and name not in args.only:
            continue
        line = check_agents(examples) if method is None else check(examples, name, method,
                                                                   seeded)
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()

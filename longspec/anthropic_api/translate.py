"""A Messages body as the chat body the OpenAI endpoint takes (openai_api/schemas.py's
ChatBody), which the server then turns into its settings as it does every chat's
(openai_api/translate.py's body_settings): one translation, one pipeline.

| Anthropic | chat |
|---|---|
| `system` (a text or text blocks) | a first `system` message |
| an assistant's `tool_use` blocks {id, name, input} | its `tool_calls` (arguments as JSON text) |
| a user's `tool_result` blocks {tool_use_id, content} | `tool` messages, before its text |
| `tools` [{name, description, input_schema}] | functions {name, description, parameters} |
| `tool_choice` auto / any / tool (name) / none | auto / required / the function named / none |
| `disable_parallel_tool_use` | `parallel_tool_calls: false` |
| `stop_sequences` | `stop` |
| `output_config.format` (json_schema) | `response_format` json_schema |

A tool_use block's id is "toolu_" + the id of the call the model made (`tool_use_id`); the id
a client sends back maps to the call's id again (`call_id`), so the template sees the ids it
would see through the OpenAI endpoint.
"""

from __future__ import annotations

import json
import logging

from ..openai_api.responses import APIError
from ..openai_api.schemas import ChatBody
from .schemas import EXTENSIONS, Block, CountTokensBody, MessageParam, Tool

TOOL_USE_PREFIX = "toolu_"
CHOICES = {"auto": "auto", "any": "required", "none": "none"}
log = logging.getLogger("longspec.serve")


def tool_use_id(call_id: str) -> str:
    return TOOL_USE_PREFIX + call_id


def call_id(tool_use: str) -> str:
    return tool_use.removeprefix(TOOL_USE_PREFIX)


def chat_body(body: CountTokensBody) -> ChatBody:
    """The chat body of a Messages body pydantic has checked; APIError for what it let
    pass (a field, block or tool longspec cannot honour)."""
    bad = body.unsupported()
    if bad is not None:
        raise APIError(400, f"{bad[0]}={bad[1]!r} is not supported by longspec; leave it out",
                       param=bad[0])
    if body.ignored():
        log.warning("fields ignored (neither Anthropic's nor longspec's): %s",
                    ", ".join(body.ignored()))
    if body.messages[-1].role == "assistant":
        raise APIError(400, "the last message is the assistant's: a prefill, which longspec "
                       "does not continue; end with the user's turn", param="messages")
    system = [] if body.system is None else [{"role": "system", "content": _parts(body.system)}]
    fields = {**body.model_dump(include=set(EXTENSIONS)), "model": body.model,
              "messages": system + [m for i, turn in enumerate(body.messages)
                                    for m in _turn(turn, f"messages.{i}")],
              "max_tokens": body.max_tokens, "stop": body.stop_sequences, "stream": body.stream,
              "temperature": body.temperature, **_tools(body), **_output(body)}
    if body.prediction is not None:
        fields["prediction"] = ({"type": "content", "content": body.prediction}
                                if isinstance(body.prediction, str)
                                else body.prediction.model_dump())
    return ChatBody.model_validate(fields)


def _parts(content: str | list[Block]) -> str | list[dict]:
    """Blocks as OpenAI's content parts (a type other than text is refused where the chat
    message's text is read)."""
    if isinstance(content, str):
        return content
    return [{"type": b.type, "text": b.text} for b in content]


def _turn(turn: MessageParam, where: str) -> list[dict]:
    """One Anthropic turn as chat messages: an assistant's text and tool calls; a user's tool
    results (a `tool` message each) and text, in their order."""
    blocks = turn.content
    if isinstance(blocks, str):
        return [{"role": turn.role, "content": blocks}]
    if turn.role == "assistant":
        calls = [_call(b, f"{where}.content.{k}") for k, b in enumerate(blocks)
                 if b.type == "tool_use"]
        text = [b for b in blocks if b.type != "tool_use"]
        return [{"role": "assistant", "content": _parts(text) if text or not calls else None,
                 **({"tool_calls": calls} if calls else {})}]
    out: list[dict] = []
    for k, b in enumerate(blocks):
        if b.type == "tool_result":
            if b.tool_use_id is None:
                raise APIError(400, f"{where}.content.{k}: a tool_result needs its tool_use_id",
                               param="messages")
            out.append({"role": "tool", "tool_call_id": call_id(b.tool_use_id),
                        "content": _parts(b.content or "")})
        elif out and out[-1]["role"] == "user":
            out[-1]["content"].append(_parts([b])[0])
        else:
            out.append({"role": "user", "content": _parts([b])})
    return out


def _call(block: Block, where: str) -> dict:
    if block.id is None or block.name is None:
        raise APIError(400, f"{where}: a tool_use block needs its id, name and input",
                       param="messages")
    return {"id": call_id(block.id), "type": "function",
            "function": {"name": block.name, "arguments": json.dumps(block.input or {})}}


def _tools(body: CountTokensBody) -> dict:
    """`tools`, `tool_choice` and `parallel_tool_calls` as the chat body takes them."""
    out = {}
    if body.tools is not None:
        out["tools"] = [_function(i, t) for i, t in enumerate(body.tools)]
    choice = body.tool_choice
    if choice is not None:
        if choice.type == "tool":
            names = [t.name for t in body.tools or []]
            if choice.name not in names:
                raise APIError(400, 'tool_choice of type "tool" must name one of the tools '
                               f"({', '.join(names)}), got {choice.name!r}",
                               param="tool_choice")
            out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            out["tool_choice"] = CHOICES[choice.type]
        if choice.disable_parallel_tool_use:
            out["parallel_tool_calls"] = False
    return out


def _function(i: int, tool: Tool) -> dict:
    if tool.type not in (None, "custom") or tool.input_schema is None:
        raise APIError(400, f"tools.{i} ({tool.name!r}, type {tool.type!r}) is one of "
                       "Anthropic's server tools, which longspec does not run: declare it as a "
                       "client tool with an input_schema", param="tools")
    function = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _output(body: CountTokensBody) -> dict:
    """output_config: its format as response_format; a thinking effort is refused."""
    config = body.output_config
    if config is None:
        return {}
    if config.effort is not None:
        raise APIError(400, f"output_config.effort={config.effort!r} is not supported by "
                       "longspec (its models do not think in Anthropic's way); leave it out",
                       param="output_config")
    if config.format is None:
        return {}
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": "output", "schema": config.format.schema_}}}

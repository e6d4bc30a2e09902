"""The items of OpenAI's Responses API: a conversation's items as the chat messages a chat
template takes, and a generation's result as a response's output items.

Input items: messages (role user, system, developer or assistant; content a text or a list of
input_text / output_text parts), `function_call` items (an assistant's call: call_id, name,
arguments) and `function_call_output` items (the client's answer to one). A developer message is
a system message (chat templates know no other). Calls become the `tool_calls` of the assistant
message before them (one is opened where none is), their outputs `tool` messages, in OpenAI's
chat form: a response's output items are input items of the next turn, so the same messages
come of them whether a client sends them back or names the response (previous_response_id).
"""

from __future__ import annotations

import uuid

from ..api import GenerationResult
from ..outputs.tool_formats import ToolFormat

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_messages(items: list[dict], previous: int = 0) -> list[dict]:
    """The conversation's items as chat messages; a ValueError naming an item that is not one
    of the kinds above (its index in the request's input: the first `previous` items are a
    previous response's)."""
    messages: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i - previous}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an item (an object), got {item!r:.60}")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise ValueError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
            messages.append({"role": ROLES[role],
                             "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": _field(item, "call_id", where), "type": "function",
                    "function": {"name": _field(item, "name", where),
                                 "arguments": _field(item, "arguments", where)}}
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _field(item, "call_id", where),
                             "content": _text(item.get("output"), f"{where}.output")})
        else:
            raise ValueError(f"{where}: items of type {kind!r} are not supported by longspec; "
                             "it takes messages, function_call and function_call_output items")
    return messages


def _field(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a string, got {value!r:.60}")
    return value


def _text(content, where: str) -> str:
    """A content's text: a string, or its text parts joined; other parts (images, files,
    audio) are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where} must be a text or a list of parts, got {content!r:.60}")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise ValueError(f"{where}: parts of type {kind!r} are not supported: longspec "
                             "serves text models (input_text and output_text parts)")
        texts.append(part["text"])
    return "".join(texts)


def message_item(item_id: str, text: str, status: str) -> dict:
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": [text_part(text)]}


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": []}


def call_item(call: dict, status: str, arguments: str | None = None) -> dict:
    """A function_call item of one of the result's calls (OpenAI's chat form); `arguments`
    replaces the call's (a streamed item opens with none)."""
    function = call["function"]
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"),
            "call_id": call["id"], "name": function["name"],
            "arguments": function["arguments"] if arguments is None else arguments,
            "status": status}


def output_content(result: GenerationResult, tools: ToolFormat | None) -> tuple[str, list]:
    """The result's text without its calls, and the calls (OpenAI's chat form)."""
    if tools is None:
        return result.text, []
    return tools.parse(result.text)[0] or "", result.tool_calls or []


def item_status(result: GenerationResult) -> str:
    return "incomplete" if result.finish_reason == "length" else "completed"


def output_items(result: GenerationResult, tools: ToolFormat | None, message_id: str
                 ) -> list[dict]:
    """The response's output: a message with the text (where there is text, or no call), then
    a function_call item per call."""
    text, calls = output_content(result, tools)
    status = item_status(result)
    message = [message_item(message_id, text, status)] if text or not calls else []
    return message + [call_item(call, "completed") for call in calls]

"""Tool calls (OpenAI's `tools` and `tool_choice`) for models whose chat template takes tools
and writes calls as Hermes-style blocks (Qwen2.5's does):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The tools go to the chat template; the output's blocks become `tool_calls`. tool_choice
"required" or a named function holds the output to such blocks by a grammar (grammar.py), whose
arguments follow each function's JSON schema; "auto" lets the model write text, then calls or
none, and holds the calls' arguments to the schemas of the functions marked `strict` (where no
function is, it leaves the output free); "none" sends no tools.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence

from .grammar import Constraint

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
CHOICES = ("none", "auto", "required")
# a call's JSON as the templates write it ({"name": "f", "arguments": {"a": 1}}): no other
# whitespace, so that its keys and punctuation are forced tokens
CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def takes_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders tools and writes Hermes-style calls."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str):
        template = json.dumps(template)
    return "tools" in template and OPEN in template


def checked_tools(model, tools, tool_choice, parallel: bool = True
                  ) -> tuple[list[dict] | None, Constraint | None]:
    """The tools to render (None: none) and the constraint tool_choice puts on the output
    (`parallel` False: one call at most, as OpenAI's parallel_tool_calls false); a ValueError
    naming what is wrong (before any work)."""
    if tools is None or (isinstance(tools, Sequence) and not tools):
        if tool_choice not in (None, "none", "auto"):
            raise ValueError("tool_choice names a tool, but no tools were given")
        return None, None
    if not takes_tools(model.tokenizer):
        raise ValueError(f"{model.name}'s chat template takes no tools (it has no "
                         f"{OPEN} blocks): send the request without tools")
    names = [_function(tool)["name"] for tool in tools]
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None, None
    functions = [_function(t) for t in tools]
    if choice == "auto":
        if parallel and not any(f.get("strict") for f in functions):
            return list(tools), None
        return list(tools), _calls_constraint(model.tokenizer, functions, many=parallel,
                                              text=True)
    if choice == "required":
        return list(tools), _calls_constraint(model.tokenizer, functions, many=parallel)
    name = (choice.get("function") or {}).get("name") if isinstance(choice, Mapping) else None
    if name not in names:
        raise ValueError(f"tool_choice must be one of {', '.join(CHOICES)} or "
                         f'{{"type": "function", "function": {{"name": ...}}}} naming one of '
                         f"the tools ({', '.join(names)}), got {tool_choice!r}")
    return list(tools), _calls_constraint(model.tokenizer, [_function(tools[names.index(name)])],
                                          many=False)


def _function(tool) -> dict:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if (not isinstance(tool, Mapping) or tool.get("type", "function") != "function"
            or not isinstance(function, Mapping) or not isinstance(function.get("name"), str)):
        raise ValueError('each tool must be {"type": "function", "function": {"name": ..., '
                         f'"parameters": {{...}}}}}}, got {tool!r:.80}')
    return dict(function)


def _marker(tokenizer, text: str) -> str:
    """A block marker in the grammar: its token, named by id, where the vocabulary holds it as
    one (Qwen2.5's <tool_call> is a special token, which a quoted text would not match), else
    its text."""
    token = tokenizer.convert_tokens_to_ids(text)
    if isinstance(token, int) and token != tokenizer.unk_token_id and \
            tokenizer.decode([token]) == text:
        return f"<[{token}]>"
    return json.dumps(text)


def _calls_constraint(tokenizer, functions: list[dict], many: bool,
                      text: bool = False) -> Constraint:
    """Calls of these functions, one (a named function, or not `many`) or one or more
    (required), each block's JSON held to {"name": the function's, "arguments": its
    parameters' schema}. With `text` (auto), any text first, then calls (one at most where not
    `many`) or none, and only `strict` functions' arguments held to their schemas (the others'
    to a JSON object)."""
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": f["name"]},
                             "arguments": (f.get("parameters") or {"type": "object"})
                             if f.get("strict") or not text else {"type": "object"}}}
             for f in functions]
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": CALL_JSON}
    opening, closing = _marker(tokenizer, OPEN), _marker(tokenizer, CLOSE)
    rest = f'"\\n" body "\\n" {closing} "\\n"?'          # a block after its opening marker
    if not text:
        start = f"start: call{'+' if many else ''}"
    elif opening.startswith("<["):
        # the marker is a special token, never part of a text
        start = f"start: TEXT call{'*' if many else '?'}\nTEXT: /(.|\\n)*/"
    else:
        # a text marker: the text before a first block ends lazily at its marker; a text
        # without one never holds it
        start = (f"start: TEXT | prefix rest{' call*' if many else ''}\nrest: {rest}\n"
                 f"prefix[lazy]: /(.|\\n)*{OPEN}/\n"
                 f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{OPEN}(.|\\n)*/")
    lark = (f"{start}\n"
            f"call: {opening} {rest}\n"
            f"body: %json {json.dumps(schema)}\n")
    return Constraint("grammar", lark)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """The text before the output's tool call blocks (None when empty) and the calls, in
    OpenAI's form ({"id", "type": "function", "function": {"name", "arguments": JSON text}});
    a block that is not a call's JSON stays in the text."""
    calls, kept, at = [], [], 0
    for match in CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
            name, arguments = call["name"], call.get("arguments", {})
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        kept.append(text[at:match.start()])
        at = match.end()
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": name, "arguments": json.dumps(arguments)}})
    kept.append(text[at:])
    content = "".join(kept).strip()
    return (content or None), calls


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI's messages as chat templates take them: an assistant's tool calls with their
    arguments as mappings (OpenAI sends JSON text)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [_template_call(call) for call in m["tool_calls"]]
        out.append(m)
    return out


def _template_call(call: Mapping) -> dict:
    call = dict(call)
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except json.JSONDecodeError:
            pass
    call["function"] = function
    return call


def held_back(text: str) -> int:
    """How much of a streamed text can go out now: all of it but what may be, or is, a tool
    call block (from the first OPEN, or a tail that may begin one)."""
    start = text.find(OPEN)
    if start >= 0:
        return start
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return len(text) - k
    return len(text)

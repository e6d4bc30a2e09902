"""Tool calls (OpenAI's `tools` and `tool_choice`) for models whose chat template takes tools,
in the format the model writes them (tool_formats.py: named, or recognised from the template).

The tools go to the chat template; the output's calls become `tool_calls`. tool_choice
"required" or a named function holds the output to calls by a grammar (grammar.py), whose
arguments follow each function's JSON schema; "auto" lets the model write text or calls, and
holds the calls' arguments to the schemas of the functions marked `strict` (where no function
is, it leaves the output free); "none" sends no tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .grammar import Constraint
from .tool_formats import FORMATS, ToolFormat, named_format, recognised

CHOICES = ("none", "auto", "required")


class ToolUse(NamedTuple):
    """A request's tools as checked: what the template renders (None: none), the constraint
    tool_choice puts on the output (None: free) and the format the calls are read in (None:
    the result has no calls)."""

    tools: list[dict] | None
    constraint: Constraint | None
    format: ToolFormat | None


def tool_format(model, name: str | None = None) -> ToolFormat:
    """The format of the model's calls: the one named, else the one its chat template writes;
    a ValueError when it takes no tools, or writes calls in no format known."""
    template = getattr(model.tokenizer, "chat_template", None) or ""
    if not isinstance(template, str):
        template = json.dumps(template)
    if "tools" not in template:
        raise ValueError(f"{model.name}'s chat template takes no tools: send the request "
                         "without tools")
    if name is not None:
        return named_format(name)
    found = recognised(template)
    if found is None:
        raise ValueError(f"{model.name}'s chat template writes tool calls in no format "
                         f"longspec recognises: name one with tool_format= (the server's "
                         f"--tool-call-format): {', '.join(FORMATS)}")
    return found


def checked_tools(model, tools, tool_choice, parallel: bool = True,
                  format_name: str | None = None) -> ToolUse:
    """The request's tools checked (`parallel` False: one call at most, as OpenAI's
    parallel_tool_calls false); a ValueError naming what is wrong (before any work)."""
    if format_name is not None:
        named_format(format_name)
    if tools is None or (isinstance(tools, Sequence) and not tools):
        if tool_choice not in (None, "none", "auto"):
            raise ValueError("tool_choice names a tool, but no tools were given")
        return ToolUse(None, None, None)
    fmt = tool_format(model, format_name)
    functions = [_function(tool) for tool in tools]
    names = [f["name"] for f in functions]
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolUse(None, None, None)
    if choice == "auto":
        if parallel and not any(f.get("strict") for f in functions):
            return ToolUse(list(tools), None, fmt)
        return ToolUse(list(tools), fmt.constraint(model.tokenizer, functions, parallel, True),
                       fmt)
    if choice == "required":
        return ToolUse(list(tools), fmt.constraint(model.tokenizer, functions, parallel, False),
                       fmt)
    name = (choice.get("function") or {}).get("name") if isinstance(choice, Mapping) else None
    if name not in names:
        raise ValueError(f"tool_choice must be one of {', '.join(CHOICES)} or "
                         f'{{"type": "function", "function": {{"name": ...}}}} naming one of '
                         f"the tools ({', '.join(names)}), got {tool_choice!r}")
    return ToolUse(list(tools), fmt.constraint(model.tokenizer, [functions[names.index(name)]],
                                               False, False), fmt)


def _function(tool) -> dict:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if (not isinstance(tool, Mapping) or tool.get("type", "function") != "function"
            or not isinstance(function, Mapping) or not isinstance(function.get("name"), str)):
        raise ValueError('each tool must be {"type": "function", "function": {"name": ..., '
                         f'"parameters": {{...}}}}}}, got {tool!r:.80}')
    return dict(function)


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

"""The body of OpenAI's Responses API (POST /v1/responses) and its translation into the chat
completion it asks for (a ChatBody), which then goes through the one translation of a body into
generation settings (translate.body_settings): a Responses request runs as its chat request.

Its fields, as the chat body's (schemas.py), are of three kinds: implemented (declared below, and
longspec's own fields of the chat body, EXTENSIONS, taken as the chat endpoint takes them and
checked by ChatBody's definitions), neutral (NEUTRAL: accepted and ignored), or refused with a
400 naming them unless they hold their neutral value (UNSUPPORTED; `reasoning` with an effort
other than "none"; built-in tools). Where tool_choice holds the output to calls ("required" or a
named function), the output has no text for text.format to shape, and the format is left out.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field

from .responses import APIError
from .responses_items import input_messages
from .schemas import ChatBody, unknown_fields, unsupported_field

# OpenAI's fields that do not change the output here: accepted and ignored (max_tool_calls and
# image concern built-in tools and images, which longspec has not)
NEUTRAL = ("user", "metadata", "service_tier", "safety_identifier", "prompt_cache_key",
           "prompt_cache_retention", "prompt_cache_options", "stream_options", "max_tool_calls",
           "image", "access_programs", "background_options")
# OpenAI's fields that would change the output or the request's course, and that longspec does
# not implement -> their neutral values; any other value is refused. `include` asks for the
# outputs of built-in tools, reasoning and logprobs, none of which a response here has.
UNSUPPORTED = {"background": (None, False), "conversation": (None,), "prompt": (None,),
               "context_management": (None, []), "moderation": (None,),
               "truncation": (None, "disabled"), "include": (None, []), "top_logprobs": (None, 0)}
# longspec's fields of the chat body, taken in a Responses body as the chat endpoint takes them
EXTENSIONS = ("seed", "stop", "stop_token_ids", "frequency_penalty", "presence_penalty",
              "logit_bias", "min_p", "top_k", "eta", "repetition_penalty", "penalty_window",
              "min_tokens", "method", "options", "ignore_eos", "return_token_ids", "prediction",
              "structured_outputs")
TEXT_FORMATS = ("text", "json_schema", "json_object")
log = logging.getLogger("longspec.serve")


class ResponsesBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    model: str
    input: str | list[dict] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    text: dict | None = None
    reasoning: dict | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool = False

    def items(self) -> list[dict]:
        """The input as a list of items (a text is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return list(self.input or [])

    def chat_body(self, previous: list[dict]) -> ChatBody:
        """The chat request this one asks for, continuing the items of a previous response's
        conversation (`previous`); APIError for what is refused, pydantic's ValidationError for
        a longspec field ChatBody's definitions refuse."""
        self._check()
        if self.ignored():
            log.warning("fields ignored (neither OpenAI's nor longspec's): %s",
                        ", ".join(self.ignored()))
        items = previous + self.items()
        if not items:
            raise APIError(400, "input is missing: give a text or a list of items",
                           param="input")
        try:
            messages = input_messages(items, len(previous))
        except ValueError as e:
            raise APIError(400, str(e), param="input") from None
        if self.instructions:
            messages.insert(0, {"role": "system", "content": self.instructions})
        tools = [_chat_tool(i, tool) for i, tool in enumerate(self.tools or [])]
        choice = _chat_tool_choice(self.tool_choice)
        forced = bool(tools) and choice not in (None, "auto", "none")
        response_format = self._response_format()
        extra = self.model_extra or {}
        return ChatBody.model_validate({
            "model": self.model, "messages": messages,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "stream": self.stream,
            "tools": tools or None, "tool_choice": choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": None if forced else response_format,
            **{name: extra[name] for name in EXTENSIONS if extra.get(name) is not None}})

    def _check(self) -> None:
        """Refuse a field set to what longspec cannot honour, naming it."""
        bad = unsupported_field(self.model_extra or {}, UNSUPPORTED)
        if bad is not None:
            raise APIError(400, f"{bad[0]}={bad[1]!r} is not supported by longspec; leave it "
                           "out", param=bad[0])
        reasoning = self.reasoning or {}
        if any(v is not None for k, v in reasoning.items() if k != "effort") or \
                reasoning.get("effort") not in (None, "none"):
            raise APIError(400, f"reasoning={self.reasoning!r} is not supported by longspec "
                           "(its models do not reason apart from their output); leave it out "
                           'or give {"effort": "none"}', param="reasoning")

    def _response_format(self) -> dict | None:
        """text.format as the chat's response_format (None: free text)."""
        text = self.text or {}
        if text.get("verbosity") not in (None, "medium"):
            raise APIError(400, f"text.verbosity={text['verbosity']!r} is not supported by "
                           "longspec; leave it out", param="text.verbosity")
        fmt = text.get("format") or {"type": "text"}
        if not isinstance(fmt, dict) or fmt.get("type") not in TEXT_FORMATS:
            raise APIError(400, f"text.format must be one of types {', '.join(TEXT_FORMATS)}, "
                           f"got {fmt!r:.80}", param="text.format")
        if fmt["type"] == "text":
            return None
        if fmt["type"] == "json_object":
            return {"type": "json_object"}
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "text.format of type json_schema needs its `schema`",
                           param="text.format")
        spec = {k: fmt.get(k) for k in ("name", "schema", "strict", "description")}
        return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items()
                                                       if v is not None}}

    def echo(self) -> dict:
        """The request's settings a response repeats (OpenAI's defaults where it gave none)."""
        extra = self.model_extra or {}
        return {"instructions": self.instructions, "max_output_tokens": self.max_output_tokens,
                "metadata": extra.get("metadata") or {},
                "parallel_tool_calls": self.parallel_tool_calls is not False,
                "previous_response_id": self.previous_response_id,
                "reasoning": {"effort": None, "summary": None},
                "store": self.store is not False,
                "temperature": 1.0 if self.temperature is None else self.temperature,
                "text": {"format": (self.text or {}).get("format") or {"type": "text"},
                         "verbosity": "medium"},
                "tool_choice": self.tool_choice or "auto", "tools": self.tools or [],
                "top_p": 1.0 if self.top_p is None else self.top_p,
                "truncation": "disabled", "user": extra.get("user"), "background": False}

    def ignored(self) -> list[str]:
        """The fields that are none of OpenAI's nor longspec's (ignored, and logged)."""
        return unknown_fields(self.model_extra or {}, NEUTRAL, UNSUPPORTED, EXTENSIONS)


def _chat_tool(index: int, tool: dict) -> dict:
    """A function tool in the chat's form; a built-in tool is refused, naming it."""
    kind = tool.get("type")
    if kind != "function" or not isinstance(tool.get("name"), str):
        what = f"the tool {kind!r}" if kind != "function" else "a function tool without a name"
        raise APIError(400, f"tools[{index}]: {what} is not supported by longspec; it calls "
                       'function tools ({"type": "function", "name": ..., "parameters": ...}) '
                       "that the client runs", param="tools")
    function = {k: tool.get(k) for k in ("name", "description", "parameters", "strict")}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    """tool_choice in the chat's form: a mode, or {"type": "function", "name": ...} naming a
    function; another kind (a built-in tool, allowed_tools, mcp) is refused."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function":
        raise APIError(400, f"tool_choice={choice!r} is not supported by longspec; give "
                       '"auto", "required", "none" or {"type": "function", "name": ...}',
                       param="tool_choice")
    return {"type": "function", "function": {"name": choice.get("name")}}

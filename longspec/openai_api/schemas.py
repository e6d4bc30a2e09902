"""Request bodies of the OpenAI-compatible endpoints, checked by pydantic before anything is
queued. Types are strict (the string "5" is not a number). Every field of OpenAI's bodies is
one of three kinds: implemented (declared below), one that does not change the output and is
ignored (NEUTRAL: `user`, `metadata`, ...), or one that would change it and that longspec does
not implement, refused with a 400 naming it unless it holds its neutral value (UNSUPPORTED). A
field of none of these (another server's extension, a misspelling) is ignored and logged by
name (`ignored`), as vLLM does.

Besides OpenAI's fields, a request may carry longspec's (vLLM's names where vLLM has them):
min_p, top_k (0 or -1: off), eta, repetition_penalty (longspec's contextual penalty, over the
last penalty_window tokens), min_tokens, stop_token_ids, method, options, ignore_eos,
return_token_ids. OpenAI's `prediction` (predicted outputs) is a draft source of `auto` and
`suffix`. An output is held to a grammar by OpenAI's `response_format` (json_object,
json_schema) or vLLM's `structured_outputs` (one of json, regex, choice, grammar, json_object).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..request import MAX_SEED

MAX_N = 16      # choices a request may ask for
# OpenAI's fields that do not change the output: accepted and ignored
NEUTRAL = ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
           "prompt_cache_retention", "prompt_cache_options")
# OpenAI's fields that would change the output and that longspec does not implement -> their
# neutral values, accepted (and ignored); any other value is refused
UNSUPPORTED = {"echo": (None, False), "best_of": (None, 1), "suffix": (None, ""),
               "audio": (None,), "modalities": (None, ["text"]), "functions": (None, []),
               "function_call": (None, "none", "auto"), "reasoning_effort": (None,),
               "verbosity": (None,), "web_search_options": (None,), "moderation": (None,)}
# vLLM's structured_outputs keys -> the Request setting each one is
STRUCTURED_OUTPUTS = {"json": "json_schema", "regex": "regex", "choice": "choice",
                      "grammar": "grammar"}


def unsupported_field(extra: dict, unsupported: dict) -> tuple[str, object] | None:
    """The first of `extra`'s fields (a body's undeclared ones) that `unsupported` names and
    that holds none of its neutral values, with that value."""
    for name, neutral in unsupported.items():
        if name in extra and not any(extra[name] == v for v in neutral):
            return name, extra[name]
    return None


def unknown_fields(extra: dict, *known) -> list[str]:
    """`extra`'s fields that none of `known` names (ignored, and logged)."""
    return sorted(set(extra).difference(*known))


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None


def parts_text(content: str | list[ContentPart]) -> str:
    """A message's or a prediction's text; parts other than text are refused (ValueError)."""
    if isinstance(content, str):
        return content
    for part in content:
        if part.type != "text" or part.text is None:
            raise ValueError(f"content of type {part.type!r} is not supported: longspec serves "
                             "text models")
    return "".join(part.text for part in content)


class Prediction(BaseModel):
    """OpenAI's predicted output: the text the completion is expected to be, mostly."""

    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["content"]
    content: str | list[ContentPart]


class GenerationBody(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    n: int = Field(1, ge=1, le=MAX_N)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # longspec's
    min_p: float | None = Field(None, ge=0, lt=1)
    top_k: int | None = Field(None, ge=-1)
    eta: float | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0)
    min_tokens: int | None = Field(None, ge=0)
    stop_token_ids: list[int] | None = None
    penalty_window: int | None = Field(None, ge=1)
    method: str | None = None
    options: dict[str, int | str] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    prediction: Prediction | None = None
    response_format: dict | None = None
    structured_outputs: dict | None = None

    def constraint(self) -> dict:
        """The Request settings of response_format or structured_outputs (ValueError for a
        malformed one, or for both)."""
        if self.structured_outputs is None:
            return {} if self.response_format is None else {
                "response_format": self.response_format}
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError("give response_format or structured_outputs, not both")
        given = {k: v for k, v in self.structured_outputs.items() if v not in (None, False)}
        if given.pop("json_object", None) is True:
            given["response_format"] = {"type": "json_object"}
        unknown = sorted(set(given) - set(STRUCTURED_OUTPUTS) - {"response_format"})
        if unknown:
            raise ValueError(f"structured_outputs.{unknown[0]} is not supported; it takes one "
                             f"of: {', '.join(STRUCTURED_OUTPUTS)}, json_object")
        return {STRUCTURED_OUTPUTS.get(k, k): v for k, v in given.items()}

    def unsupported(self) -> tuple[str, object] | None:
        """The first field set to a value longspec cannot honour, with that value."""
        return unsupported_field(self.model_extra or {}, UNSUPPORTED)

    def ignored(self) -> list[str]:
        """The fields that are none of OpenAI's nor longspec's (ignored, and logged)."""
        return unknown_fields(self.model_extra or {}, NEUTRAL, UNSUPPORTED)


class CompletionBody(GenerationBody):
    prompt: str | list[int] | list[str]
    logprobs: int | None = Field(None, ge=0, le=5)

    def top_logprobs_asked(self) -> int | None:
        """The alternatives listed beside each token; None: no logprobs."""
        return self.logprobs


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        """The message's text; parts other than text are refused (ValueError)."""
        if self.content is None:
            if self.role != "assistant":     # only an assistant's turn may be empty
                raise ValueError(f"a message of role {self.role!r} needs content")
            return ""
        return parts_text(self.content)

    def for_template(self) -> dict:
        """The message as the chat template takes it: its text, and an assistant's tool calls
        or a tool's answer with their ids."""
        out = {"role": self.role, "content": self.text()}
        extra = self.model_extra or {}
        for key in ("tool_calls", "tool_call_id", "name"):
            if extra.get(key) is not None:
                out[key] = extra[key]
        return out


class ChatBody(GenerationBody):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None

    def top_logprobs_asked(self) -> int | None:
        """The alternatives listed beside each token; None: no logprobs (ValueError for
        top_logprobs without logprobs, as OpenAI refuses it)."""
        if not self.logprobs:
            if self.top_logprobs:
                raise ValueError("top_logprobs needs logprobs: true")
            return None
        return self.top_logprobs or 0

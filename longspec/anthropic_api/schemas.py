"""Request bodies of Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens),
checked by pydantic before anything is queued, as the OpenAI endpoints' are
(openai_api/schemas.py): strict types; each of Anthropic's fields implemented (declared below),
neutral (NEUTRAL: accepted and ignored), or refused with a 400 naming it unless it holds its
neutral value (UNSUPPORTED); a field of none of these is ignored and logged by name.

Besides Anthropic's fields a body may carry longspec's (EXTENSIONS), defined as the OpenAI
endpoints define them, and `prediction` (a text, or OpenAI's {"type": "content", "content"}).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..openai_api.schemas import GenerationBody, Prediction, unknown_fields, unsupported_field

# Anthropic's fields that do not change the output: accepted and ignored
NEUTRAL = ("metadata", "service_tier", "container", "cache_control", "diagnostics",
           "inference_geo", "speed", "user_profile_id", "workspace_id", "anthropic_version")
# Anthropic's fields that would change the output and that longspec does not implement -> their
# neutral values, accepted (and ignored); any other value is refused
UNSUPPORTED = {"thinking": (None, {"type": "disabled"}), "mcp_servers": (None, []),
               "context_management": (None,)}
# longspec's fields, as the OpenAI endpoints take them
EXTENSIONS = ("seed", "top_p", "top_k", "min_p", "eta", "repetition_penalty", "penalty_window",
              "min_tokens", "stop_token_ids", "method", "options", "ignore_eos",
              "return_token_ids")

_Extensions = create_model(
    "_Extensions", __config__=ConfigDict(strict=True, extra="allow"),
    **{name: (GenerationBody.model_fields[name].annotation, GenerationBody.model_fields[name])
       for name in EXTENSIONS})


class Block(BaseModel):
    """A content block: text, tool_use (an assistant's), tool_result (a user's; its content a
    text or text blocks) or another type, refused where it is read."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None
    id: str | None = None                 # tool_use
    name: str | None = None
    input: dict | None = None
    tool_use_id: str | None = None        # tool_result
    content: str | list[Block] | None = None
    is_error: bool | None = None


class MessageParam(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    """A client tool ({name, description, input_schema}); a server tool (a `type` such as
    web_search_20250305) is refused where it is read."""

    model_config = ConfigDict(strict=True, extra="allow")
    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict | None = None
    strict: bool | None = None


class ToolChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class JsonFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    format: JsonFormat | None = None
    effort: str | None = None             # thinking effort: refused where it is read


class CountTokensBody(_Extensions):
    """What shapes the prompt (and, for /v1/messages, the generation: MessagesBody)."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    stream: bool = False
    output_config: OutputConfig | None = None
    prediction: str | Prediction | None = None

    def unsupported(self) -> tuple[str, object] | None:
        """The first field set to a value longspec cannot honour, with that value."""
        return unsupported_field(self.model_extra or {}, UNSUPPORTED)

    def ignored(self) -> list[str]:
        """The fields that are none of Anthropic's nor longspec's (ignored, and logged)."""
        return unknown_fields(self.model_extra or {}, NEUTRAL, UNSUPPORTED)


class MessagesBody(CountTokensBody):
    max_tokens: int = Field(ge=1)

"""Results in the shapes of Anthropic's Messages API: a whole message, the server-sent events of
a streamed one (message_start, content_block_start / _delta / _stop, message_delta,
message_stop), and errors {"type": "error", "error": {"type", "message"}}.

Usage follows Anthropic's accounting: input_tokens + cache_read_input_tokens is the prompt,
the second the part of it the prompt cache held. Besides Anthropic's fields a message carries
longspec's `speculative` object and `seed` as the OpenAI responses do
(openai_api/responses.py), and `token_ids` when the request asks for them (streamed: in the
message_delta event, with the others).
"""

from __future__ import annotations

import json
import uuid

from ..api import GenerationResult
from ..openai_api.responses import cached_tokens, speculative
from ..outputs.tool_formats import ToolFormat
from .translate import tool_use_id

# longspec's finish reasons -> Anthropic's stop reasons
STOP_REASONS = {"eos": "end_turn", "stop": "stop_sequence", "length": "max_tokens",
                "tool_calls": "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
               504: "timeout_error"}


def error_body(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def event(name: str, data: dict) -> str:
    """One server-sent event, named."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def usage(result: GenerationResult) -> dict:
    cached = cached_tokens(result)
    return {"input_tokens": result.prompt_tokens - cached, "output_tokens": len(result.token_ids),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def tool_use(call: dict) -> dict:
    """A call in OpenAI's form as a tool_use block."""
    function = call["function"]
    return {"type": "tool_use", "id": tool_use_id(call["id"]), "name": function["name"],
            "input": json.loads(function["arguments"])}


class Reply:
    """The bodies of one message: whole, or as the events of its stream (start, one `delta`
    per chunk, `end`)."""

    def __init__(self, model_name: str, seed: int, tokenizer, stops: list[str],
                 tools: ToolFormat | None, token_ids: bool):
        """`stops`: the request's stop_sequences (which one matched is read from the tokens);
        `tools`: the format of the output's calls, whose text a stream holds back."""
        self.id = "msg_" + uuid.uuid4().hex
        self.model_name = model_name
        self.seed = seed
        self.tokenizer = tokenizer
        self.stops = stops
        self.tools = tools
        self.token_ids = token_ids
        self._text = ""         # the streamed text (with tools) ...
        self._sent = 0          # ... and how much of it went out
        self._block = -1        # the index of the last content block opened
        self._open = False      # ... a text block, still open

    def _head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model_name}

    def _stop(self, result: GenerationResult) -> dict:
        """stop_reason, and stop_sequence: the stop sequence the text was cut before (a stop
        token id is an end of turn)."""
        reason, matched = STOP_REASONS[result.finish_reason], None
        if reason == "stop_sequence":
            whole = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
            cut = whole[len(result.text):]
            matched = next((s for s in self.stops if cut.startswith(s)), None)
            reason = "end_turn" if matched is None else reason
        return {"stop_reason": reason, "stop_sequence": matched}

    def _longspec(self, result: GenerationResult) -> dict:
        return {"speculative": speculative(result.stats), "seed": self.seed,
                **({"token_ids": result.token_ids} if self.token_ids else {})}

    def whole(self, result: GenerationResult) -> dict:
        text = self.tools.parse(result.text)[0] if self.tools else result.text
        content = ([{"type": "text", "text": text}] if text else []) + [
            tool_use(call) for call in result.tool_calls or []]
        return {**self._head(), "content": content, **self._stop(result),
                "usage": usage(result), **self._longspec(result)}

    # -- streamed -------------------------------------------------------------------------------

    def start(self, prompt_tokens: int) -> str:
        message = {**self._head(), "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
        return event("message_start", {"type": "message_start", "message": message})

    def delta(self, text: str) -> str:
        """The events of a chunk's text: what of it can go out now (with tools, the text from
        where a call may begin is held back: ToolFormat.held_back)."""
        if text and self.tools:
            self._text += text
            upto = self.tools.held_back(self._text)
            text = self._text[self._sent:upto]
            self._sent = max(self._sent, upto)
        return self._text_delta(text)

    def end(self, result: GenerationResult) -> str:
        """The text held back, the calls as tool_use blocks, the stop reason and usage."""
        held = self.tools.parse(self._text[self._sent:])[0] if self.tools else None
        out = self._text_delta(held or "")
        if self._open:
            out += self._close()
        for call in result.tool_calls or []:
            out += self._open_block({**tool_use(call), "input": {}})
            out += self._delta({"type": "input_json_delta",
                                "partial_json": call["function"]["arguments"]})
            out += self._close()
        out += event("message_delta", {"type": "message_delta", "delta": self._stop(result),
                                        "usage": usage(result), **self._longspec(result)})
        return out + event("message_stop", {"type": "message_stop"})

    def _text_delta(self, text: str) -> str:
        if not text:
            return ""
        opened = "" if self._open else self._open_block({"type": "text", "text": ""})
        self._open = True
        return opened + self._delta({"type": "text_delta", "text": text})

    def _open_block(self, block: dict) -> str:
        self._block += 1
        return event("content_block_start", {"type": "content_block_start",
                                             "index": self._block, "content_block": block})

    def _delta(self, delta: dict) -> str:
        return event("content_block_delta", {"type": "content_block_delta",
                                             "index": self._block, "delta": delta})

    def _close(self) -> str:
        self._open = False
        return event("content_block_stop", {"type": "content_block_stop", "index": self._block})

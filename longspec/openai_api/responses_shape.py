"""A response of OpenAI's Responses API, whole or as the server-sent events of a stream.

A stream, in OpenAI's order, each event numbered (`sequence_number`): response.created and
response.in_progress; the message's output_item.added and content_part.added once its first
text goes out, then an output_text.delta per piece of text; at the end output_text.done,
content_part.done and output_item.done, then per call output_item.added,
function_call_arguments.delta and .done and output_item.done; last response.completed, or
response.incomplete (the output reached max_output_tokens), or response.failed (the generation
failed, timed out or the server shut down). With tools, the text is held back from where a call
may begin (ToolFormat.held_back), as the chat endpoint holds it.

Besides OpenAI's fields a response carries longspec's `speculative` and `seed` (as the chat
endpoint's), and `token_ids` when the request asked for return_token_ids.
"""

from __future__ import annotations

import json
import time

from ..api import GenerationResult
from ..outputs.tool_formats import ToolFormat
from .responses import APIError, cached_tokens, speculative
from .responses_items import (
    call_item,
    item_status,
    message_item,
    new_id,
    output_content,
    output_items,
    text_part,
)


def usage(result: GenerationResult) -> dict:
    n = len(result.token_ids)
    return {"input_tokens": result.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens(result)},
            "output_tokens": n, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": result.prompt_tokens + n}


class ResponseShape:
    """The bodies and events of one response."""

    def __init__(self, model_name: str, echo: dict, seed: int, token_ids: bool,
                 tools: ToolFormat | None):
        """`echo`: the request's settings the response repeats (ResponsesBody.echo); `tools`:
        the format of the output's calls (None: the request had no tools)."""
        self.id = new_id("resp")
        self.message_id = new_id("msg")
        self.created_at = int(time.time())
        self.model_name = model_name
        self.echo = echo
        self.seed = seed
        self.token_ids = token_ids
        self.tools = tools
        self.sequence = 0
        self._text = ""          # the streamed text ...
        self._sent = 0           # ... and how much of it went out
        self._opened = False     # the message's item and part went out

    def body(self, status: str, output: list[dict], result: GenerationResult | None = None,
             error: dict | None = None) -> dict:
        out = {"id": self.id, "object": "response", "created_at": self.created_at,
               "status": status, "error": error,
               "incomplete_details": {"reason": "max_output_tokens"}
               if status == "incomplete" else None,
               "model": self.model_name, "output": output, **self.echo,
               "usage": None if result is None else usage(result), "seed": self.seed}
        if status == "completed":
            out["completed_at"] = int(time.time())
        if result is not None:
            out["speculative"] = speculative(result.stats)
            if self.token_ids:
                out["token_ids"] = result.token_ids
        return out

    def whole(self, result: GenerationResult) -> dict:
        return self.body(item_status(result), output_items(result, self.tools,
                                                           self.message_id), result)

    # -- a stream -------------------------------------------------------------------------------

    def event(self, kind: str, **fields) -> str:
        """One server-sent event, numbered."""
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    def start(self) -> list[str]:
        body = self.body("in_progress", [])
        return [self.event("response.created", response=body),
                self.event("response.in_progress", response=body)]

    def delta(self, text: str) -> list[str]:
        """The events of a chunk's text: what of it can go out now."""
        self._text += text
        upto = len(self._text) if self.tools is None else self.tools.held_back(self._text)
        piece = self._text[self._sent:upto]
        self._sent = max(self._sent, upto)
        return self._text_events(piece) if piece else []

    def _text_events(self, piece: str) -> list[str]:
        return self._open() + [self.event("response.output_text.delta", output_index=0,
                                          item_id=self.message_id, content_index=0,
                                          delta=piece, logprobs=[])]

    def _open(self) -> list[str]:
        """The message's item and part, before its first text."""
        if self._opened:
            return []
        self._opened = True
        item = {**message_item(self.message_id, "", "in_progress"), "content": []}
        return [self.event("response.output_item.added", output_index=0, item=item),
                self.event("response.content_part.added", output_index=0,
                           item_id=self.message_id, content_index=0, part=text_part(""))]

    def end(self, result: GenerationResult) -> tuple[dict, list[str]]:
        """The finished response, and the events that close its stream: the text held back
        (less its calls), the message's end, the calls."""
        calls = output_content(result, self.tools)[1]
        status = item_status(result)
        rest = result.text[self._sent:]
        if self.tools is not None:
            rest = self.tools.parse(rest)[0] or ""
        text = result.text[:self._sent] + rest
        events = self._text_events(rest) if rest else []
        output = []
        if text or not calls or self._opened:
            message = message_item(self.message_id, text, status)
            events += [*self._open(),
                       self.event("response.output_text.done", output_index=0,
                                  item_id=self.message_id, content_index=0, text=text,
                                  logprobs=[]),
                       self.event("response.content_part.done", output_index=0,
                                  item_id=self.message_id, content_index=0,
                                  part=text_part(text)),
                       self.event("response.output_item.done", output_index=0, item=message)]
            output.append(message)
        for call in calls:
            index, item = len(output), call_item(call, "completed")
            events += [self.event("response.output_item.added", output_index=index,
                                  item=call_item(call, "in_progress", arguments="")),
                       self.event("response.function_call_arguments.delta",
                                  output_index=index, item_id=item["id"],
                                  delta=item["arguments"]),
                       self.event("response.function_call_arguments.done",
                                  output_index=index, item_id=item["id"],
                                  arguments=item["arguments"]),
                       self.event("response.output_item.done", output_index=index, item=item)]
            output.append(item)
        body = self.body(status, output, result)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return body, events + [self.event(kind, response=body)]

    def failed(self, error: APIError) -> str:
        """The event of a generation that did not finish (APIError: why)."""
        return self.event("response.failed", response=self.body(
            "failed", [], error={"code": error.code or "server_error", "message": error.message}))

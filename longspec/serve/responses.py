"""Response bodies in OpenAI's shapes: completions, chat completions, their streamed chunks,
and errors `{"error": {"message", "type", "param", "code"}}`.

longspec adds, per response, a `speculative` object with the quantities vLLM counts for
speculative decoding (its metric names): num_drafts (verify steps), num_draft_tokens,
num_accepted_tokens, draft_acceptance_rate (accepted / drafted) and mean_acceptance_length
(new tokens per step, the bonus token included); plus `seed`, the seed the sampling used (a
fresh random one when the request named none).
"""

from __future__ import annotations

import json
import time
import uuid

from ..api import GenerationResult

# longspec's finish reasons -> OpenAI's
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


def error_body(message: str, type_: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """A request the server refuses, with the status and body the client gets."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type_, param, code)
        self.headers = headers


def timeout_body(timeout_s: float) -> dict:
    return error_body(f"the generation did not finish within the request timeout of "
                      f"{timeout_s:g} s (time in the queue included); ask for fewer max_tokens, "
                      "or raise the server's --request-timeout", "timeout_error",
                      code="request_timeout")


def failure_body(error: str) -> dict:
    return error_body(f"the generation failed: {error}", "server_error", code="internal_error")


def speculative(stats: dict) -> dict:
    return {"method": stats["method"], "num_drafts": stats["steps"],
            "num_draft_tokens": stats["drafted_tokens"],
            "num_accepted_tokens": stats["accepted_draft_tokens"],
            "draft_acceptance_rate": stats["acceptance_rate"],
            "mean_acceptance_length": stats["mean_accepted_length"]}


def cached_tokens(result: GenerationResult) -> int:
    """The prompt's tokens whose keys and values came from the prompt cache."""
    return min(result.stats["cached_tokens"], result.prompt_tokens)


def usage(result: GenerationResult) -> dict:
    """OpenAI's usage: the prompt's tokens the prompt cache held, and the tokens of a
    prediction accepted and rejected (predicted outputs; 0 without one)."""
    n = len(result.token_ids)
    prediction = result.stats.get("prediction", {})
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": n,
            "total_tokens": result.prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": cached_tokens(result)},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "accepted_prediction_tokens": prediction.get("accepted_tokens", 0),
                "rejected_prediction_tokens": prediction.get("rejected_tokens", 0)}}


class Shape:
    """The bodies of one response: a completion or a chat completion, whole or in chunks."""

    def __init__(self, chat: bool, model_name: str, seed: int, token_ids: bool):
        self.chat = chat
        self.model_name = model_name
        self.seed = seed
        self.token_ids = token_ids        # the client asked for return_token_ids
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_name}

    def whole(self, result: GenerationResult) -> dict:
        choice = {"index": 0, "finish_reason": FINISH_REASONS[result.finish_reason]}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
            choice["logprobs"] = None
        else:
            choice.update(text=result.text, logprobs=None)
        if self.token_ids:
            choice["token_ids"] = result.token_ids
        body = self._head("chat.completion" if self.chat else "text_completion")
        return {**body, "choices": [choice], "usage": usage(result),
                "speculative": speculative(result.stats), "seed": self.seed}

    def chunk(self, text: str | None = None, token_ids: list[int] | None = None,
              finish_reason: str | None = None, first: bool = False) -> dict:
        choice: dict = {"index": 0}
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice.update(delta=delta, logprobs=None)
        else:
            choice.update(text=text or "", logprobs=None)
        choice["finish_reason"] = finish_reason
        if self.token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"),
                "choices": [choice]}

    def last_chunk(self, result: GenerationResult) -> dict:
        body = self.chunk(finish_reason=FINISH_REASONS[result.finish_reason], token_ids=[])
        return {**body, "speculative": speculative(result.stats), "seed": self.seed}

    def usage_chunk(self, result: GenerationResult) -> dict:
        """What `stream_options: {"include_usage": true}` asks for: no choices, the usage."""
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return {**head, "choices": [], "usage": usage(result)}


def sse(data: dict | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"

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
from ..outputs.tool_formats import ToolFormat

# longspec's finish reasons -> OpenAI's
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def error_body(message: str, type_: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """A request the server refuses (or a generation that ended badly), with its status; the
    body in OpenAI's shape (`body`), or another API's from the same fields."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers

    @property
    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def timeout_error(timeout_s: float) -> APIError:
    return APIError(504, f"the generation did not finish within the request timeout of "
                    f"{timeout_s:g} s (time in the queue included); ask for fewer max_tokens, "
                    "or raise the server's --request-timeout", "timeout_error",
                    code="request_timeout")


def failure_error(error: str) -> APIError:
    return APIError(500, f"the generation failed: {error}", "server_error",
                    code="internal_error")


def shutdown_error() -> APIError:
    return APIError(503, "the server is shutting down", "server_error")


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


def _total(results: list[GenerationResult]) -> dict:
    """The usage of a request's choices: its prompt once, their completions together."""
    first = usage(results[0])
    if len(results) > 1:
        n = sum(len(r.token_ids) for r in results)
        details = first["completion_tokens_details"]
        for key in ("accepted_prediction_tokens", "rejected_prediction_tokens"):
            details[key] = sum(usage(r)["completion_tokens_details"][key] for r in results)
        first.update(completion_tokens=n, total_tokens=first["prompt_tokens"] + n)
    return first


class Shape:
    """The bodies of one response: a completion or a chat completion, whole or in chunks, of
    one choice per seed (n)."""

    def __init__(self, chat: bool, model_name: str, seeds: list[int], token_ids: bool,
                 tokenizer=None, logprobs: bool = False, tools: ToolFormat | None = None):
        """`tools`: the format of the output's tool calls, which become message.tool_calls
        (outputs/tool_formats.py); a stream holds back the text from where one may begin."""
        self.chat = chat
        self.tools = tools
        self._texts = [""] * len(seeds)     # each choice's streamed text (with tools) ...
        self._sent = [0] * len(seeds)       # ... and how much of it went out
        self.model_name = model_name
        self.seeds = seeds
        self.token_ids = token_ids        # the client asked for return_token_ids
        self.tokenizer = tokenizer
        self.logprobs = logprobs          # ... for logprobs
        self._left_out: dict[int, bool] = {}    # by token: a special token the text leaves out
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_name}

    def _piece(self, token: int) -> str:
        return self.tokenizer.decode([token]) if self.tokenizer is not None else str(token)

    def _in_text(self, token: int) -> bool:
        """Whether the token's text is in the response's text: not a special token (an
        end-of-turn's `<|im_end|>`) that decoding leaves out."""
        if self.tokenizer is None:
            return True
        if token not in self._left_out:
            shown = self.tokenizer.decode([token], skip_special_tokens=True)
            self._left_out[token] = shown == "" and self.tokenizer.decode([token]) != ""
        return not self._left_out[token]

    def _logprobs(self, entries: list[dict] | None) -> dict | None:
        """OpenAI's logprobs object for these tokens (sampling.token_logprobs' entries): chat's
        `content` list, or completions' parallel lists; as OpenAI's, they cover the text's
        tokens, so a special token the text leaves out (the end of the turn) is not listed."""
        if not self.logprobs or entries is None:
            return None
        entries = [e for e in entries if self._in_text(e["token"])]
        if self.chat:
            def item(token: int, logprob: float) -> dict:
                piece = self._piece(token)
                return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}
            return {"content": [{**item(e["token"], e["logprob"]),
                                 "top_logprobs": [item(t, lp) for t, lp in e["top"]]}
                                for e in entries], "refusal": None}
        tokens = [self._piece(e["token"]) for e in entries]
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{self._piece(t): lp for t, lp in e["top"]} for e in entries],
                "text_offset": offsets}

    def _choice(self, index: int, result: GenerationResult) -> dict:
        choice = {"index": index, "finish_reason": FINISH_REASONS[result.finish_reason],
                  "logprobs": self._logprobs(result.logprobs)}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
            if self.tools:      # the calls as the library parsed them (their ids), once
                choice["message"]["content"] = self.tools.parse(result.text)[0]
                if result.tool_calls:
                    choice["message"]["tool_calls"] = result.tool_calls
        else:
            choice["text"] = result.text
        if self.token_ids:
            choice["token_ids"] = result.token_ids
        if len(self.seeds) > 1:
            choice["seed"] = self.seeds[index]
        return choice

    def whole(self, results: list[GenerationResult]) -> dict:
        body = self._head("chat.completion" if self.chat else "text_completion")
        stats = [r.stats for r in results]
        return {**body, "choices": [self._choice(i, r) for i, r in enumerate(results)],
                "usage": _total(results), "speculative": self._speculative(stats),
                "seed": self.seeds[0]}

    def _speculative(self, stats: list[dict]) -> dict | list[dict]:
        return speculative(stats[0]) if len(stats) == 1 else [speculative(s) for s in stats]

    def chunk(self, index: int, text: str | None = None, token_ids: list[int] | None = None,
              logprobs: list[dict] | None = None, finish_reason: str | None = None,
              first: bool = False) -> dict:
        choice: dict = {"index": index}
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if text and self.tools:
                text = self._release(index, text)
            if text:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = self._logprobs(logprobs)
        choice["finish_reason"] = finish_reason
        if self.token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"),
                "choices": [choice]}

    def _release(self, index: int, text: str) -> str:
        """What of a choice's streamed text can go out now (ToolFormat.held_back)."""
        self._texts[index] += text
        upto = self.tools.held_back(self._texts[index])
        piece = self._texts[index][self._sent[index]:upto]
        self._sent[index] = max(self._sent[index], upto)
        return piece

    def last_chunk(self, index: int, result: GenerationResult) -> dict:
        body = self.chunk(index, finish_reason=FINISH_REASONS[result.finish_reason],
                          token_ids=[])
        if self.chat and self.tools:
            # the text held back: its content, then the result's calls as OpenAI streams them
            content = self.tools.parse(result.text[self._sent[index]:])[0]
            delta = body["choices"][0]["delta"]
            if content:
                delta["content"] = content
            if result.tool_calls:
                delta["tool_calls"] = [{"index": k, **call}
                                       for k, call in enumerate(result.tool_calls)]
        return {**body, "speculative": speculative(result.stats), "seed": self.seeds[index]}

    def usage_chunk(self, results: list[GenerationResult]) -> dict:
        """What `stream_options: {"include_usage": true}` asks for: no choices, the usage."""
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return {**head, "choices": [], "usage": _total(results)}


def sse(data: dict | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"

"""OpenAI request bodies as longspec's generation settings: the one translation that the server
and batch jobs of OpenAI's Batch API lines (jobs/batch_job.py) share."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any

from ..drafters import METHODS
from ..request import MAX_SEED
from ..sampling.logits import SamplingConfig
from .responses import APIError
from .schemas import GenerationBody, parts_text

COMPLETIONS_DEFAULT_MAX_TOKENS = 16     # OpenAI's default for /v1/completions
log = logging.getLogger("longspec.serve")


@dataclass(frozen=True)
class Defaults:
    """What a body that does not say takes."""

    method: str
    draft_model: Any = None     # for a method that needs one
    heads: Any = None           # for a method that takes a trained drafter
    seed: int | None = None     # None: a fresh random seed (the response names it)
    tool_format: str | None = None      # None: the one the chat template writes


def body_settings(body: GenerationBody, chat: bool, defaults: Defaults) -> tuple[Any, dict]:
    """The prompt and `stream`'s keyword settings of a body pydantic has checked (max_new_tokens
    None: the rest of the context, for a chat that names none); APIError for what it let
    pass."""
    bad = body.unsupported()
    if bad is None and not chat:
        bad = next(((k, v) for k, v in (body.model_extra or {}).items()
                    if k in ("tools", "tool_choice", "parallel_tool_calls")
                    and v is not None), None)
    if bad is not None:
        raise APIError(400, f"{bad[0]}={bad[1]!r} is not supported by longspec; leave it "
                       "out", param=bad[0])
    if body.ignored():
        log.warning("fields ignored (neither OpenAI's nor longspec's): %s",
                    ", ".join(body.ignored()))
    if chat:
        try:
            prompt = [m.for_template() for m in body.messages]
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        max_tokens = body.max_completion_tokens or body.max_tokens
    else:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request, got {len(prompt)}",
                               param="prompt")
            prompt = prompt[0]
        max_tokens = body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
    sampling = SamplingConfig(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(0, body.top_k or 0), min_p=body.min_p or 0.0,
        penalty=body.repetition_penalty or 1.0,
        penalty_window=body.penalty_window or SamplingConfig.penalty_window,
        frequency_penalty=body.frequency_penalty or 0.0,
        presence_penalty=body.presence_penalty or 0.0, eta=body.eta or 0.0)
    try:
        logprobs = body.top_logprobs_asked()
    except ValueError as e:
        raise APIError(400, str(e), param="top_logprobs") from None
    try:
        prediction = None if body.prediction is None else parts_text(body.prediction.content)
    except ValueError as e:
        raise APIError(400, str(e), param="prediction") from None
    try:
        constraint = body.constraint()
    except ValueError as e:
        raise APIError(400, str(e), param="response_format") from None
    method = body.method or defaults.method
    spec = METHODS.get(method)
    return prompt, {
        "max_new_tokens": max_tokens, "method": method, "sampling": sampling,
        "seed": body.seed if body.seed is not None else (
            secrets.randbelow(MAX_SEED + 1) if defaults.seed is None else defaults.seed),
        "stop": _stops(body), "ignore_eos": body.ignore_eos, "options": body.options,
        "min_new_tokens": body.min_tokens or 0,
        "draft_model": defaults.draft_model if spec and spec.needs_draft_model else None,
        "heads": defaults.heads if spec and spec.needs_heads else None,
        "prediction": prediction, "logprobs": logprobs, "logit_bias": body.logit_bias,
        "early_first_token": body.stream,
        **constraint, **({"tools": body.tools, "tool_choice": body.tool_choice,
                          "parallel_tool_calls": body.parallel_tool_calls is not False,
                          "tool_format": defaults.tool_format}
                         if chat else {})}


def _stops(body: GenerationBody) -> list | str | None:
    """The stop strings and vLLM's stop_token_ids, as `stop` takes them."""
    if not body.stop_token_ids:
        return body.stop
    strings = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return strings + list(body.stop_token_ids)

"""The public entry points: `generate` and `stream`.

Every argument is checked before any work, and a bad one raises ValueError naming the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass

from .drafters import DraftSetup
from .engine.batching import Batch
from .engine.generation import Engine
from .models.loader import Model
from .outputs.text import TextStream, cut_at_stop, decode
from .progress import ProgressBar
from .request import Prepared, Request, prepare_request
from .sampling.sampler import Sampler
from .step.sizing import generation_sizer


@dataclass
class GenerationResult:
    token_ids: list[int]   # new tokens only, complete (special tokens and stop included)
    text: str              # their text as a user should see it ('' without a tokenizer)
    stats: dict
    finish_reason: str     # "eos", "stop", "length" or "interrupted"
    prompt_tokens: int
    logprobs: list[dict] | None = None   # per new token, when asked for (token_logprobs)
    # the calls in the text (read by the request's tool format, in OpenAI's form; finish_reason
    # "tool_calls" where there are some), for a request whose template rendered tools ([]:
    # none made)
    tool_calls: list[dict] | None = None


@dataclass
class Chunk:
    token_ids: list[int]   # tokens committed by one step
    text: str              # the text they add ('' while it is held back)
    logprobs: list[dict] | None = None   # theirs, when asked for (token_logprobs)


def prediction_usage(prediction: list[int], output: list[int]) -> dict:
    """OpenAI's accounting of a predicted output: the prediction's tokens that appear in the
    output (in order, as a diff of the two matches them) and the prediction's others."""
    matcher = difflib.SequenceMatcher(None, prediction, output, autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return {"accepted_tokens": accepted, "rejected_tokens": len(prediction) - accepted}


def prepare(model: Model, request: Request) -> tuple[Engine, list[int]]:
    """Check every argument, then build the engine; nothing runs yet. Returns the engine and
    the token ids to start it with (the prompt, then the tokens of `resume_from`)."""
    ready = prepare_request(model, request)
    return build_engine(model, ready), ready.prompt_ids + ready.resumed


def build_engine(model: Model, ready: Prepared) -> Engine:
    """The engine of a prepared request (its sampler, drafter and stop rules); nothing runs.

    A resumed run is the same generation as an uninterrupted one: the sampler's noise is keyed
    on the original prompt and absolute positions, the engine prefills prompt + resumed tokens
    and has max_new_tokens - len(resumed) left (so the context it plans for is the same), and
    the stop rules have seen the resumed tokens (a stop string may straddle the seam)."""
    r, n, resumed, prompt_ids = ready.request, ready.max_new_tokens, ready.resumed, \
        ready.prompt_ids
    rules = ready.stop
    sampler = Sampler(ready.sampling, ready.seed, prompt_ids, model.config.vocab_size,
                      model.device, rejection=r.verify == "rejection", grammar=ready.grammar,
                      bias=ready.bias,
                      least=(r.min_new_tokens, sorted(rules.eos_ids | rules.stop_ids)))
    context = len(prompt_ids) + n
    budget = ready.budget
    sizer = generation_sizer(model, r.method, sampler.config, budget.max_nodes)
    drafter = ready.spec.build(DraftSetup(model, budget, ready.options, sampler, sizer,
                                          r.draft_model, r.heads,
                                          capacity=context + budget.max_nodes + 1,
                                          context=context, prediction=tuple(ready.prediction)))
    engine = Engine(model, drafter, sampler, budget, n - len(resumed), rules, r.method,
                    sizer=sizer)
    engine.done = ready.done
    engine.logprobs_top = r.logprobs
    engine.early_first_token = r.early_first_token
    engine.check_memory(len(prompt_ids) + len(resumed))
    return engine


class Stream:
    """Iterate for `Chunk`s as steps commit them; `result` holds the generation once the
    iteration ends or `close()` stops it early (what was committed so far). When resuming,
    `resumed_text` is the text of the resumed tokens, so that resumed_text + the chunks' text
    is the text of the whole generation."""

    def __init__(self, model: Model, engine: Engine, ready: Prepared, progress: bool):
        self.model = model
        self.engine = engine
        self.request = ready.request
        self.prompt_ids = ready.prompt_ids
        self.resumed = ready.resumed
        self.progress = progress
        self.result: GenerationResult | None = None
        self.prediction = ready.prediction
        self.tools = ready.tools
        tok, r, stop, prompt_ids = model.tokenizer, ready.request, engine.stop, ready.prompt_ids
        # the text keeps the markers of the format's calls where they are special tokens
        self.keep_special = (r.keep_special if self.tools is None or r.keep_special
                             else self.tools.kept(tok))
        self._text = (TextStream(tok, prompt_ids[-4:], stop.stop_strings, self.keep_special,
                                 r.include_stop) if tok is not None else None)
        self.resumed_text = ""
        if self._text is not None and self.resumed:
            self.resumed_text = (self._text.finish(self.resumed, stop.by_string) if engine.done
                                 else self._text.push(self.resumed))
        self._token_ids = list(self.resumed)
        self._bar: ProgressBar | None = None
        self._chunks = self._run()

    def __iter__(self) -> Iterator[Chunk]:
        return self._chunks

    def close(self) -> None:
        self._chunks.close()
        if self.result is None:     # closed before the first step
            self.result = self._result(list(self.resumed), self.engine.done)

    @property
    def start_ids(self) -> list[int]:
        """The ids the engine starts with: the prompt, then the resumed tokens."""
        return self.prompt_ids + self.resumed

    def _run(self) -> Iterator[Chunk]:
        """The generation alone: a batch of one (engine/batching.py), stepped as the chunks are
        asked for; closing it stops the generation where it is."""
        self._bar = ProgressBar(self.engine.max_new_tokens, enabled=self.progress)
        batch = Batch(self.model)
        try:
            yield from batch.join(self)
            while batch.members:
                for _, item in batch.step():
                    if isinstance(item, Exception):
                        raise item
                    yield item
        finally:
            batch.close()

    def take(self, new: list[int]) -> Chunk:
        """The chunk of tokens a step of the engine committed (as a batch's steps hand them
        over: engine/batching.py)."""
        self._token_ids.extend(new)
        if self._bar is not None:
            self._bar.update(len(new), self.engine.stats)
        text = self._text
        if text is None:
            piece = ""
        elif self.engine.done:
            piece = text.finish(new, self.engine.stop.by_string)
        else:
            piece = text.push(new)
        engine = self.engine
        logprobs = (None if engine.logprobs_top is None
                    else engine.logprobs[len(engine.logprobs) - len(new):])
        return Chunk(new, piece, logprobs)

    def end(self, finished: bool) -> None:
        """The generation ended (`finished`) or was stopped: its result is what it committed."""
        if self._bar is not None:
            self._bar.close()
        self.result = self._result(list(self._token_ids), finished)

    def _result(self, token_ids: list[int], finished: bool) -> GenerationResult:
        stop, r, tok = self.engine.stop, self.request, self.model.tokenizer
        text = ""
        if tok is not None:
            text = decode(tok, token_ids, self.keep_special)
            if stop.by_string and not r.include_stop:
                text = cut_at_stop(text, stop.stop_strings)
        reason = (stop.reason or "length") if finished else "interrupted"
        stats = self.engine.result_stats()
        if r.resume_from is not None:
            stats["resumed_tokens"] = len(self.resumed)
        if self.prediction:
            stats["prediction"] = prediction_usage(self.prediction, token_ids)
        logprobs = None if self.engine.logprobs_top is None else list(self.engine.logprobs)
        calls = None
        if self.tools:
            calls = self.tools.parse(text)[1] if finished else []
            reason = "tool_calls" if calls else reason
        return GenerationResult(token_ids, text, stats, reason, len(self.prompt_ids), logprobs,
                                calls)


def stream(model: Model, prompt, *, progress: bool = False, **settings) -> Stream:
    """Like `generate`, but returns a `Stream` yielding new tokens as they are committed."""
    return stream_request(model, make_request(prompt, settings), progress)


def stream_request(model: Model, request: Request, progress: bool = False) -> Stream:
    """`stream` of a Request already made (a batch job's lines)."""
    return open_prepared(model, prepare_request(model, request), progress)


def open_prepared(model: Model, ready: Prepared, progress: bool = False) -> Stream:
    """`stream` of a request already prepared (prepare_request: the server prepares requests
    off the thread that decodes, then opens them on it)."""
    return Stream(model, build_engine(model, ready), ready, progress)


def generate(model: Model, prompt, *, progress: bool = False, **settings) -> GenerationResult:
    """Generate up to `max_new_tokens` after `prompt`: text, token ids, or chat messages
    ([{"role": ..., "content": ...}], through the tokenizer's chat template).

    Keyword settings, as `Request` names them: max_new_tokens, method, sampling, seed,
    draft_model, heads, stop, ignore_eos, verify, options, keep_special, include_stop,
    resume_from (the token ids an interrupted run with the same settings committed: the result
    is then that of the uninterrupted run, its token_ids the whole generation), prediction
    (the output expected, as OpenAI's predicted outputs: text or token ids that `auto` and
    `suffix` draft from; stats["prediction"] counts its accepted and rejected tokens),
    json_schema / regex / grammar / choice / response_format (the output held to a grammar:
    outputs/grammar.py), logprobs (each new token's log probability and that many
    alternatives'), logit_bias, tools and tool_choice (outputs/tools.py: the result's tool_calls),
    early_first_token (the first step plain: the first token as soon as `ar`'s).
    Every method returns exactly the tokens `ar` returns for the same seed and settings
    (verify="match"); verify="rejection" keeps the distribution instead. `options` tunes the
    method (max_nodes, max_depth and method-specific sizes; see docs/methods.md).
    """
    s = stream(model, prompt, progress=progress, **settings)
    for _ in s:
        pass
    return s.result


def make_request(prompt, settings: dict) -> Request:
    """The Request of `generate`'s keyword settings (TypeError for one it does not take)."""
    unknown = sorted(set(settings) - set(Request.fields()))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}; settings are: "
                        f"{', '.join(f for f in Request.fields() if f != 'prompt')}")
    return Request(prompt, **settings)

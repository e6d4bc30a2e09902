"""The public entry points: `generate` and `stream`.

Every argument is checked before any work, and a bad one raises ValueError naming the fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .drafters import DraftSetup, check_arguments, get_method
from .engine import Engine
from .models.loader import Model
from .progress import ProgressBar
from .sampler import Sampler
from .sampling import SamplingConfig
from .stopping import StopRules
from .text import Detokenizer


@dataclass
class GenerationResult:
    token_ids: list[int]   # new tokens only
    text: str              # their text ('' without a tokenizer)
    stats: dict


@dataclass
class Chunk:
    token_ids: list[int]   # tokens committed by one step
    text: str              # the text they add ('' while a character is incomplete)


@dataclass(frozen=True)
class Request:
    """One generation's settings, as `generate` and `stream` take them."""

    prompt: Any                               # a string or token ids
    max_new_tokens: int = 256
    method: str = "ar"
    sampling: SamplingConfig | None = None    # None: SamplingConfig() (temperature 1)
    seed: int = 0
    draft_model: Model | None = None
    heads: Any = None                         # a directory, loaded heads, or None (bundled)
    stop: Any = None                          # stop strings and token ids
    ignore_eos: bool = False
    verify: str = "match"
    options: Mapping | None = field(default=None)


def encode_prompt(model: Model, prompt) -> list[int]:
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError(f"{model.path} has no tokenizer: pass the prompt as token ids")
        if not prompt:
            raise ValueError("the prompt is empty")
        ids = list(model.tokenizer(prompt)["input_ids"])
    else:
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise ValueError("prompt must be a string or a list of token ids") from None
        if any(isinstance(t, bool) for t in prompt) or any(float(t) != int(t) for t in prompt):
            raise ValueError("prompt token ids must be integers")
    if not ids:
        raise ValueError("the prompt is empty")
    vocab = model.config.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
    return ids


def _stop_rules(model: Model, stop, ignore_eos: bool) -> StopRules:
    stop = [stop] if isinstance(stop, (str, int)) else list(stop or [])
    ids, strings = set(), []
    for s in stop:
        if isinstance(s, str) and s:
            strings.append(s)
        elif isinstance(s, int) and not isinstance(s, bool) and 0 <= s < model.config.vocab_size:
            ids.add(s)
        else:
            raise ValueError("stop entries must be non-empty strings or token ids in the "
                             f"vocabulary, got {s!r}")
    eos = set() if ignore_eos else set(model.eos_token_ids)
    return StopRules(eos, ids, strings, model.tokenizer)


def prepare(model: Model, request: Request) -> tuple[Engine, list[int]]:
    """Check every argument, then build the engine; nothing runs yet."""
    r = request
    if not isinstance(model, Model):
        raise ValueError("model must come from longspec.load_model")
    spec = get_method(r.method)
    check_arguments(spec, draft_model=r.draft_model is not None, heads=r.heads is not None,
                    verify=r.verify)
    n = r.max_new_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {n!r}")
    if isinstance(r.seed, bool) or not isinstance(r.seed, int) or r.seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {r.seed!r}")
    sampling = (r.sampling or SamplingConfig()).validate()
    prompt_ids = encode_prompt(model, r.prompt)
    limit = model.config.context_limit
    if len(prompt_ids) + n > limit:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({n}) "
                         f"exceeds the model's context of {limit} positions; lower max_new_tokens")
    rules = _stop_rules(model, r.stop, r.ignore_eos)
    budget, options = spec.resolve(r.options)
    sampler = Sampler(sampling, r.seed, model.config.vocab_size, model.device,
                      rejection=r.verify == "rejection")
    context = len(prompt_ids) + n
    drafter = spec.build(DraftSetup(model, budget, options, sampler, r.draft_model, r.heads,
                                    capacity=context + budget.max_nodes + 1, context=context))
    engine = Engine(model, drafter, sampler, budget, n, rules, r.method)
    engine.check_memory(len(prompt_ids))
    return engine, prompt_ids


class Stream:
    """Iterate for `Chunk`s as steps commit them; `result` holds the generation once the
    iteration ends or `close()` stops it early (what was committed so far)."""

    def __init__(self, model: Model, engine: Engine, prompt_ids: list[int], progress: bool):
        self.model = model
        self.engine = engine
        self.prompt_ids = prompt_ids
        self.progress = progress
        self.result: GenerationResult | None = None
        self._chunks = self._run()

    def __iter__(self) -> Iterator[Chunk]:
        return self._chunks

    def close(self) -> None:
        self._chunks.close()

    def _run(self) -> Iterator[Chunk]:
        tok = self.model.tokenizer
        detok = Detokenizer(tok, self.prompt_ids[-4:]) if tok is not None else None
        token_ids: list[int] = []
        bar = ProgressBar(self.engine.max_new_tokens, enabled=self.progress)
        try:
            for new in self.engine.run(self.prompt_ids):
                token_ids.extend(new)
                bar.update(len(new), self.engine.stats)
                yield Chunk(new, detok.push(new) if detok else "")
            if detok:
                tail = detok.flush()
                if tail:
                    yield Chunk([], tail)
        finally:
            bar.close()
            text = tok.decode(token_ids) if tok is not None else ""
            self.result = GenerationResult(token_ids, text, self.engine.result_stats())


def stream(model: Model, prompt, *, progress: bool = False, **settings) -> Stream:
    """Like `generate`, but returns a `Stream` yielding new tokens as they are committed."""
    engine, prompt_ids = prepare(model, _request(prompt, settings))
    return Stream(model, engine, prompt_ids, progress)


def generate(model: Model, prompt, *, progress: bool = False, **settings) -> GenerationResult:
    """Generate up to `max_new_tokens` after `prompt` (a string or token ids).

    Keyword settings, as `Request` names them: max_new_tokens, method, sampling, seed,
    draft_model, heads, stop, ignore_eos, verify, options. Every method returns exactly the
    tokens `ar` returns for the same seed and settings (verify="match"); verify="rejection"
    keeps the distribution instead. `options` tunes the method (max_nodes, max_depth and
    method-specific sizes; see README).
    """
    s = stream(model, prompt, progress=progress, **settings)
    for _ in s:
        pass
    return s.result


def _request(prompt, settings: dict) -> Request:
    unknown = sorted(set(settings) - set(Request.__dataclass_fields__))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}; settings are: "
                        f"{', '.join(f for f in Request.__dataclass_fields__ if f != 'prompt')}")
    return Request(prompt, **settings)

"""One generation's settings, checked before any work: the record (`Request`), its checks, the
prompt, and the request prepared once (`prepare_request` -> `Prepared`), which everything after
reads: the Python API, the CLI, batch lines and the server alike.

Every bad argument raises ValueError (a value out of range) or TypeError (a value of the wrong
kind) naming the fix, before a cache is allocated or a forward runs.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .drafters import check_arguments, get_method
from .drafters.base import Budget
from .drafters.registry import MethodSpec
from .models.loader import Model
from .outputs.grammar import Constraint, GrammarState, constraint_of
from .outputs.stopping import StopRules
from .outputs.tool_formats import ToolFormat
from .outputs.tools import checked_tools, template_messages
from .sampling.logits import SamplingConfig

if TYPE_CHECKING:
    import torch

# text, token ids, or chat messages ({"role": ..., "content": ...})
Prompt = str | Sequence[int] | Sequence[Mapping[str, Any]]

MAX_SEED = 2**63 - 1
MAX_TOP_LOGPROBS = 20      # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class Request:
    """What `generate` and `stream` take besides the model."""

    prompt: Prompt
    max_new_tokens: int | None = 256          # None: the rest of the model's context
    min_new_tokens: int = 0                   # new tokens before an end (EOS, a stop token
                                              # or string) may come: vLLM's min_tokens
    method: str = "auto"
    sampling: SamplingConfig | None = None    # None: SamplingConfig() (temperature 1)
    seed: int = 0                             # 0 .. 2^63 - 1
    draft_model: Model | None = None
    # a trained drafter's directory, a loaded one, or None (the bundled one)
    heads: str | os.PathLike | torch.nn.Module | None = None
    stop: str | int | Sequence[str | int] | None = None     # stop strings and token ids
    ignore_eos: bool = False
    verify: str = "match"
    options: Mapping | None = None            # method tuning (max_nodes, max_depth, ...)
    keep_special: bool = False                # keep special tokens in the text
    include_stop: bool = False                # keep the stop string that ended the run
    # token ids an earlier run with these settings committed: continue after them
    resume_from: Sequence[int] | None = None
    # the output expected (text or token ids), a draft source of the methods that copy text
    prediction: str | Sequence[int] | None = None
    # the output held to one of these (outputs/grammar.py): a JSON schema (a mapping or its text), a
    # regex, a Lark grammar, a list of choices, or OpenAI's response_format (or a pydantic
    # model class)
    json_schema: Mapping[str, Any] | str | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: Sequence[str] | None = None
    response_format: Mapping[str, Any] | type | None = None
    # each new token's log probability and the `logprobs` likeliest alternatives' (0 .. 20;
    # None: off): the distribution it was chosen from, the same numbers for every method
    logprobs: int | None = None
    # token id -> a number in [-100, 100] added to its logit (OpenAI's logit_bias)
    logit_bias: Mapping[int | str, float] | None = None
    # OpenAI's tools (function definitions, for a chat whose template takes them) and
    # tool_choice ("none", "auto", "required" or a named function): outputs/tools.py
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    parallel_tool_calls: bool = True          # False: one call at most (OpenAI's)
    # the format the model writes calls in (outputs/tool_formats.py); None: the chat template's
    tool_format: str | None = None
    # the first step verifies the prompt's last token alone (for a method whose drafter can
    # skip a step): the first new token as soon as `ar`'s, one step more in all (a stream's
    # first text; the server's streamed replies)
    early_first_token: bool = False

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(cls.__dataclass_fields__)

    def constraint(self) -> Constraint | None:
        """What the output is held to (None: free text); a ValueError for a malformed one."""
        return constraint_of(json_schema=self.json_schema, regex=self.regex,
                             grammar=self.grammar, choice=self.choice,
                             response_format=self.response_format)


def as_int(value, name: str) -> int:
    """An integer argument; numpy integers welcome, bools and floats refused."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def checked_settings(r: Request) -> tuple[int, int, SamplingConfig]:
    """max_new_tokens, seed and sampling, checked."""
    n = as_int(r.max_new_tokens, "max_new_tokens")
    if n <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {n}")
    least = as_int(r.min_new_tokens, "min_new_tokens")
    if not 0 <= least <= n:
        raise ValueError(f"min_new_tokens must be in 0 .. max_new_tokens ({n}), got {least}")
    seed = as_int(r.seed, "seed")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be in 0 .. 2^63 - 1, got {seed}")
    sampling = SamplingConfig() if r.sampling is None else r.sampling
    if not isinstance(sampling, SamplingConfig):
        raise TypeError("sampling must be a longspec.SamplingConfig, got "
                        f"{type(sampling).__name__}")
    if r.options is not None and not isinstance(r.options, Mapping):
        raise TypeError(f"options must be a mapping of option names to values, got "
                        f"{type(r.options).__name__}")
    if r.logprobs is not None:
        top = as_int(r.logprobs, "logprobs")
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be 0 .. {MAX_TOP_LOGPROBS} (the alternatives "
                             f"listed beside each token), got {top}")
        if r.resume_from is not None:
            raise ValueError("logprobs cover the tokens a run writes: they do not combine with "
                             "resume_from")
    for flag in ("ignore_eos", "keep_special", "include_stop", "parallel_tool_calls",
                 "early_first_token"):
        if not isinstance(getattr(r, flag), bool):
            raise TypeError(f"{flag} must be True or False")
    return n, seed, sampling.validate()


def _chat_ids(model: Model, messages: list, tools: list | None = None) -> list[int]:
    tok = model.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise ValueError(f"{model.name} has no chat template: pass the prompt as text or ids")
    for m in messages:
        # an assistant's turn of tool calls may have no content
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), str)
                and (isinstance(m.get("content"), str)
                     or (m.get("content") is None and m.get("tool_calls")))):
            raise TypeError('chat messages must be {"role": str, "content": str} mappings, '
                            f"got {m!r}")
    extra = {} if tools is None else {"tools": tools}
    return list(tok.apply_chat_template(template_messages(messages), add_generation_prompt=True,
                                        tokenize=True, return_dict=False, **extra))


def encode_request(model: Model, r: Request) -> list[int]:
    """The request's prompt as token ids, its tools rendered by the chat template."""
    return encode_prompt(model, r.prompt, checked_tools(model, r.tools, r.tool_choice,
                                                        format_name=r.tool_format).tools)


def encode_prompt(model: Model, prompt, tools: list | None = None) -> list[int]:
    """Token ids of a prompt: text (through the tokenizer), chat messages (through its chat
    template, with the assistant's turn opened, and `tools` when given: checked_tools), or
    token ids."""
    chat = isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], Mapping)
    if tools is not None and not chat:
        raise ValueError("tools go with a chat: pass the prompt as chat messages")
    if isinstance(prompt, (bytes, bytearray)):
        raise TypeError("the prompt is bytes: decode it to text, or pass token ids as a list")
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError(f"{model.name} has no tokenizer: pass the prompt as token ids")
        if not prompt:
            raise ValueError("the prompt is empty")
        ids = list(model.tokenizer(prompt)["input_ids"])
    elif chat:
        ids = _chat_ids(model, list(prompt), tools)
    else:
        try:
            ids = [as_int(t, "prompt token ids") for t in prompt]
        except TypeError:
            raise TypeError("the prompt must be text, a list of token ids or a list of chat "
                            "messages") from None
    if not ids:
        raise ValueError("the prompt is empty")
    return check_vocab(model, ids, "prompt")


def encode_prediction(model: Model, prediction) -> list[int]:
    """Token ids of a predicted output: text (through the tokenizer, no special tokens added),
    or token ids; None or "" -> []."""
    if prediction is None:
        return []
    if isinstance(prediction, str):
        if model.tokenizer is None:
            raise ValueError(f"{model.name} has no tokenizer: pass the prediction as token ids")
        ids = list(model.tokenizer(prediction, add_special_tokens=False)["input_ids"])
    elif isinstance(prediction, (list, tuple)):
        ids = [as_int(t, "prediction token ids") for t in prediction]
    else:
        raise TypeError("the prediction must be text or a list of token ids, got "
                        f"{type(prediction).__name__}")
    return check_vocab(model, ids, "prediction")


def check_vocab(model: Model, ids: list[int], what: str) -> list[int]:
    """`ids`, once every one is inside the model's vocabulary."""
    vocab = model.config.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"{what} token id {bad[0]} is outside the vocabulary [0, {vocab})")
    return ids


def resumed_ids(model: Model, r: Request, max_new_tokens: int) -> list[int]:
    """The checked `resume_from` token ids ([] when not resuming)."""
    if r.resume_from is None:
        return []
    if isinstance(r.resume_from, (str, bytes, Mapping)):
        raise TypeError("resume_from must be a list of token ids")
    try:
        ids = [as_int(t, "resume_from token ids") for t in r.resume_from]
    except TypeError:
        raise TypeError("resume_from must be a list of token ids") from None
    check_vocab(model, ids, "resume_from")
    if len(ids) > max_new_tokens:
        raise ValueError(f"resume_from holds {len(ids)} tokens, more than max_new_tokens "
                         f"({max_new_tokens}); pass the max_new_tokens of the run it came from")
    # rejection sampling draws from a generator whose state depends on every step taken, so a
    # resumed run could not reproduce the rest of an uninterrupted one
    if ids and r.verify == "rejection":
        raise ValueError("resume_from needs verify='match': a run verified by rejection "
                         "sampling cannot be continued token for token")
    return ids


def check_length(model: Model, prompt_len: int, max_new_tokens: int) -> None:
    limit = model.config.context_limit
    if prompt_len >= limit:
        raise ValueError(f"the prompt is too long: {prompt_len} tokens, and the model's context "
                         f"holds {limit} positions")
    if prompt_len + max_new_tokens > limit:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) "
                         f"exceeds the model's context of {limit} positions; lower "
                         f"max_new_tokens to {limit - prompt_len} or less")


def logit_bias(model: Model, r: Request):
    """The request's logit_bias as a dense tensor [vocab] (None without one). Keys are token
    ids, as integers or as the strings OpenAI's JSON carries."""
    import torch

    if r.logit_bias is None or (isinstance(r.logit_bias, Mapping) and not r.logit_bias):
        return None
    if not isinstance(r.logit_bias, Mapping):
        raise TypeError("logit_bias must map token ids to numbers")
    bias = torch.zeros(model.config.vocab_size)
    for key, value in r.logit_bias.items():
        try:
            token = int(key) if isinstance(key, str) else as_int(key, "a logit_bias token id")
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys are token ids, got {key!r}") from None
        check_vocab(model, [token], "logit_bias")
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not -100 <= value <= 100):
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {value!r} "
                             f"for token {token}")
        bias[token] = float(value)
    return bias.to(model.device)


def checked_grammar(model: Model, r: Request, resumed: list[int], calls: Constraint | None
                    ) -> GrammarState | None:
    """The grammar state of a constrained request (None for free text): its constraint, or its
    tool_choice's (`calls`: checked_tools), compiled for the model; a ValueError naming what
    cannot be."""
    constraint = r.constraint()
    if constraint is not None and calls is not None:
        raise ValueError("tool_choice holds the output to tool calls: it does not combine with "
                         "another constraint")
    constraint = constraint or calls
    if constraint is None:
        return None
    if r.ignore_eos or r.min_new_tokens:
        raise ValueError("a constrained output ends where its grammar does: "
                         f"{'ignore_eos' if r.ignore_eos else 'min_new_tokens'} does not apply")
    if r.verify == "rejection":
        raise ValueError("verify='rejection' does not take a grammar (its drafts' "
                         "distributions are not masked): use verify='match'")
    state = GrammarState(model, constraint)
    if resumed and not state.follows(resumed):
        raise ValueError("resume_from's tokens do not follow the grammar: they were not made "
                         "with these settings")
    return state


def stop_rules(model: Model, r: Request) -> StopRules:
    """The request's stop rules (its stop strings and ids, end-of-sequence unless ignored)."""
    stop = r.stop
    if stop is None:
        stop = []
    stop = [stop] if isinstance(stop, str) or not isinstance(stop, Iterable) else list(stop)
    ids, strings = set(), []
    for s in stop:
        if isinstance(s, str) and s:
            strings.append(s)
            continue
        try:
            token = as_int(s, "a stop token id")
        except TypeError:
            token = -1
        if not 0 <= token < model.config.vocab_size:
            raise ValueError("stop entries must be non-empty strings or token ids in the "
                             f"vocabulary, got {s!r}")
        ids.add(token)
    eos = set() if r.ignore_eos else set(model.eos_token_ids)
    return StopRules(eos, ids, strings, model.tokenizer, r.min_new_tokens)


@dataclass(frozen=True)
class Prepared:
    """A request checked and made ready without running the model or allocating for it (the
    tokenizer, the chat template, the grammar's compilation: work that may run on any thread,
    beside a thread that decodes): what `api.build_engine` and `api.open_prepared` build
    one generation from. Its grammar state and stop rules are the generation's own: one
    Prepared, one generation."""

    request: Request
    spec: MethodSpec                  # the method that runs (`ar` where speculation is off)
    budget: Budget
    options: dict
    max_new_tokens: int
    seed: int
    sampling: SamplingConfig
    prompt_ids: list[int]
    resumed: list[int]
    prediction: list[int]
    grammar: GrammarState | None
    tools: ToolFormat | None          # the template rendered tools: the result's calls, read so
    stop: StopRules                   # having seen the resumed tokens
    bias: torch.Tensor | None         # logit_bias, dense
    done: bool                        # nothing is left to generate (a resumed run that ended)


def prepare_request(model: Model, request: Request, prompt_ids: list[int] | None = None,
                    most_new_tokens: int | None = None) -> Prepared:
    """Check every argument and make the request ready (Prepared); `prompt_ids`: the prompt
    as `encode_request` gives it, where it was encoded already (it is not encoded again);
    `most_new_tokens`: the most new tokens of a request whose max_new_tokens is None (the
    rest of the model's context)."""
    r = request
    if not isinstance(model, Model):
        raise TypeError("model must come from longspec.load_model")
    spec = get_method(r.method)
    check_arguments(spec, draft_model=r.draft_model is not None, heads=r.heads is not None,
                    verify=r.verify, prediction=bool(r.prediction))
    tools, calls, calls_format = checked_tools(model, r.tools, r.tool_choice,
                                               r.parallel_tool_calls, r.tool_format)
    if r.max_new_tokens is None:        # known once the prompt is; else checked before it
        if prompt_ids is None:
            prompt_ids = encode_prompt(model, r.prompt, tools)
        room = model.config.context_limit - len(prompt_ids)
        r = replace(r, max_new_tokens=max(1, min(room, most_new_tokens or room)))
    n, seed, sampling = checked_settings(r)
    prompt_ids = encode_prompt(model, r.prompt, tools) if prompt_ids is None else list(prompt_ids)
    prediction = encode_prediction(model, r.prediction)
    check_length(model, len(prompt_ids), n)
    resumed = resumed_ids(model, r, n)
    grammar = checked_grammar(model, r, resumed, calls)
    budget, options = spec.resolve(r.options)
    if model.profile is not None and model.profile.speculation != "on":
        # no kernel path keeps a tree's rows bitwise its tokens' alone here (selfcheck.py):
        # the method's settings are checked, then every step is plain decoding
        spec = get_method("ar")
        budget, options = spec.resolve(None)
    rules = stop_rules(model, r)
    stop_at = rules.cut(resumed)
    if stop_at is not None and stop_at < len(resumed):
        raise ValueError(f"resume_from ends the generation at its token {stop_at - 1} (a stop "
                         "rule fires there), yet goes on: it was not made with these settings")
    return Prepared(r, spec, budget, options, n, seed, sampling, prompt_ids, resumed,
                    prediction, grammar, calls_format, rules, logit_bias(model, r),
                    stop_at is not None or len(resumed) == n)

"""Flags shared by several commands, and turning them into the API's arguments."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path

from ..drafters import METHODS, check_arguments, get_method
from ..drafters.registry import MethodSpec, parse_assignment
from ..outputs.text import read_text_file
from ..sampling.logits import SamplingConfig


class Parser(argparse.ArgumentParser):
    """Usage mistakes end in one line on stderr, like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# help beside the sampling flags that need more than their name (the flags are
# SamplingConfig's fields: a setting added there is a flag here)
SAMPLING_HELP = {
    "penalty": "contextual penalty on tokens of the last --penalty-window tokens (1 = off)",
    "frequency_penalty": "OpenAI's: a token's logit less this times its count in the output",
    "presence_penalty": "OpenAI's: a token's logit less this once it occurs in the output"}


def sampling_flags(p: argparse.ArgumentParser) -> None:
    defaults = SamplingConfig()
    g = p.add_argument_group("sampling (temperature 0 is greedy)")
    for f in fields(SamplingConfig):
        g.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(defaults, f.name)),
                       default=getattr(defaults, f.name), help=SAMPLING_HELP.get(f.name))
    g.add_argument("--seed", type=int, default=0)


def sampling_from_args(args) -> SamplingConfig:
    return SamplingConfig(**{f.name: getattr(args, f.name)
                             for f in fields(SamplingConfig)}).validate()


def model_flags(p: argparse.ArgumentParser, prompt_cache: bool = False) -> None:
    """The flags that load a model; `prompt_cache`: the command serves many requests on it,
    and --prompt-cache-mb bounds what it keeps of them (else it keeps none)."""
    if prompt_cache:
        p.add_argument("--prompt-cache-mb", type=float, metavar="MIB",
                       help="bound of the prompt cache, the keys and values of earlier "
                       "requests that later ones starting alike reuse (default: an eighth of "
                       "the memory free after loading, at most 4096; 0: none)")
    else:
        p.set_defaults(prompt_cache_mb=0)
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (the "
                   "activations' dtype for quantized weights)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--dequantize", action="store_true", help="expand a quantized GGUF file "
                   "into --dtype instead of running its 4/8-bit weights as they are")
    g.add_argument("--quantize", choices=("q4", "q8"), help="quantize a dense checkpoint's "
                   "matrices group-wise (weight-only, the CPU's int4 kernel)")


def model_args(path: str, args) -> dict:
    """load_model's arguments as the model flags say (also for a Ray actor or replica to load
    it there)."""
    return {"path": path, "dtype": args.dtype, "device": args.device,
            "dequantize": args.dequantize, "quantize": args.quantize,
            "prompt_cache_mb": args.prompt_cache_mb}


def load_from_args(path: str, args):
    """A model as the model flags say."""
    from ..models import load_model

    return load_model(**model_args(path, args))


def method_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="auto", help=f"one of: {', '.join(METHODS)}")
    p.add_argument("--draft-model", help="draft model directory or bundled name (methods: "
                   f"{', '.join(n for n, s in METHODS.items() if s.takes_draft_model)})")
    p.add_argument("--heads", metavar="DIR", help="trained drafter directory, from "
                   "'longspec train-drafter': multi-token heads or an EAGLE drafter (methods: "
                   f"{', '.join(n for n, s in METHODS.items() if s.needs_heads)}; default: "
                   "the one bundled for the model, when there is)")
    p.add_argument("--verify", default="match", help="match (token-identical to ar) or "
                   "rejection (Leviathan et al.'s rule, for methods that sample their drafts)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="method tuning, e.g. max_nodes=16 (repeatable; see docs/methods.md)")


def method_from_args(args) -> tuple[MethodSpec, dict]:
    """The method and its options, checked against the other flags before any model loads."""
    spec = get_method(args.method)
    check_arguments(spec, draft_model=args.draft_model is not None, heads=args.heads is not None,
                    verify=args.verify,
                    prediction=getattr(args, "prediction_file", None) is not None)
    options = dict(parse_assignment(pair, "--option KEY=VALUE") for pair in args.option)
    spec.resolve(options)
    return spec, options


def load_optional(path: str | None, args):
    return None if path is None else load_from_args(path, args)


def prompt_flags(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file holding the prompt text ('-': standard input)")
    src.add_argument("--prompt-ids", help="comma-separated token ids (for checkpoints without "
                     "a tokenizer)")
    p.add_argument("--chat", action="store_true", help="the prompt is the user's message, "
                   "formatted with the model's chat template")
    p.add_argument("--system", help="system message (with --chat)")


def prompt_from_args(args):
    """The prompt for the API: text, token ids, or chat messages."""
    if args.prompt_ids is not None:
        if args.chat:
            raise ValueError("--chat takes --prompt or --prompt-file, not --prompt-ids")
        try:
            return [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            raise ValueError("--prompt-ids takes comma-separated integers, got "
                             f"{args.prompt_ids!r}") from None
    if args.prompt is not None:
        text = args.prompt
    elif args.prompt_file == "-":
        text = sys.stdin.read()
    else:
        text = read_text_file(args.prompt_file, "prompt file")
    if args.system is not None and not args.chat:
        raise ValueError("--system goes with --chat")
    if not args.chat:
        return text
    system = [] if args.system is None else [{"role": "system", "content": args.system}]
    return [*system, {"role": "user", "content": text}]


def constraint_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the output held to a grammar (one of these; it ends where the "
                             "grammar does)").add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE", help="a JSON schema (a .json file)")
    g.add_argument("--json-object", action="store_true", help="any JSON object")
    g.add_argument("--regex", help="a regular expression the whole output matches")
    g.add_argument("--grammar", metavar="FILE", help="a Lark grammar (llguidance's dialect)")
    g.add_argument("--choice", action="append", metavar="TEXT",
                   help="one of these texts (repeatable)")


def constraint_from_args(args) -> dict:
    """The Request settings of constraint_flags."""
    from ..outputs.text import read_text_file

    if args.json_schema is not None:
        return {"json_schema": read_text_file(args.json_schema, "--json-schema")}
    if args.json_object:
        return {"response_format": {"type": "json_object"}}
    if args.grammar is not None:
        return {"grammar": read_text_file(args.grammar, "--grammar")}
    return {"regex": args.regex, "choice": args.choice}


def check_writable(path: str | None, flag: str) -> None:
    """Refuse, before any work, an output file that cannot be appended to."""
    if path is None:
        return
    file = Path(path)
    if file.is_dir():
        raise ValueError(f"{flag} {path!r} is a directory")
    target = file if file.exists() else (file.parent if str(file.parent) else Path("."))
    if not target.exists():
        raise ValueError(f"{flag} {path!r}: directory {str(target)!r} does not exist")
    if not os.access(target, os.W_OK):
        raise ValueError(f"{flag} {path!r} is not writable")

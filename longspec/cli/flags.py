"""Flags shared by several commands, and turning them into the API's arguments."""

from __future__ import annotations

import argparse

from ..drafters import METHODS, check_arguments, get_method
from ..drafters.registry import MethodSpec, parse_assignment
from ..sampling import SamplingConfig


class Parser(argparse.ArgumentParser):
    """Usage mistakes end in one line on stderr, like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def sampling_flags(p: argparse.ArgumentParser) -> None:
    defaults = SamplingConfig()
    g = p.add_argument_group("sampling (temperature 0 is greedy)")
    g.add_argument("--temperature", type=float, default=defaults.temperature)
    g.add_argument("--top-p", type=float, default=defaults.top_p)
    g.add_argument("--top-k", type=int, default=defaults.top_k)
    g.add_argument("--min-p", type=float, default=defaults.min_p)
    g.add_argument("--eta", type=float, default=defaults.eta)
    g.add_argument("--penalty", type=float, default=defaults.penalty,
                   help="contextual penalty on tokens of the last --penalty-window tokens "
                        "(1 = off)")
    g.add_argument("--penalty-window", type=int, default=defaults.penalty_window)
    g.add_argument("--seed", type=int, default=0)


def sampling_from_args(args) -> SamplingConfig:
    return SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          min_p=args.min_p, eta=args.eta, penalty=args.penalty,
                          penalty_window=args.penalty_window).validate()


def model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")


def method_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="ar", help=f"one of: {', '.join(METHODS)}")
    p.add_argument("--draft-model", help="draft model directory or bundled name (methods: "
                   f"{', '.join(n for n, s in METHODS.items() if s.needs_draft_model)})")
    p.add_argument("--heads", help="multi-token heads directory (methods: "
                   f"{', '.join(n for n, s in METHODS.items() if s.needs_heads)})")
    p.add_argument("--verify", default="match", help="match (token-identical to ar) or "
                   "rejection (Leviathan et al.'s rule, for methods that sample their drafts)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="method tuning, e.g. max_nodes=16 (repeatable; see README)")


def method_from_args(args) -> tuple[MethodSpec, dict]:
    """The method and its options, checked against the other flags before any model loads."""
    spec = get_method(args.method)
    check_arguments(spec, draft_model=args.draft_model is not None, heads=args.heads is not None,
                    verify=args.verify)
    options = dict(parse_assignment(pair, "--option KEY=VALUE") for pair in args.option)
    spec.resolve(options)
    return spec, options


def load_optional(path: str | None, dtype: str, device: str):
    from ..models import load_model

    return None if path is None else load_model(path, dtype=dtype, device=device)

"""Command line: one module per command, each adding its parser and its `run`.

Bad input gets one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import sys

from . import batch, bench, demo, fetch, generate, info, serve, train
from .flags import Parser


def build_parser() -> Parser:
    parser = Parser(prog="longspec",
                    description="Lossless speculative decoding for long generation.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    generate.add_parser(sub)
    batch.add_parser(sub)
    demo.add_parser(sub)
    bench.add_parser(sub)
    serve.add_parser(sub)
    train.add_parsers(sub)
    fetch.add_parser(sub)
    info.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, OSError) as e:
        print(f"longspec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nlongspec: interrupted", file=sys.stderr)
        return 130


__all__ = ["build_parser", "main"]

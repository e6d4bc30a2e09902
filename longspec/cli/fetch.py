"""`longspec fetch NAME`: download a bundled model that is fetched on first use, now."""

from __future__ import annotations

from ..models.sources import FETCHED


def add_parser(sub) -> None:
    f = sub.add_parser("fetch", help="download a bundled model now (it is fetched on first use "
                       "otherwise)")
    f.add_argument("name", choices=sorted(FETCHED), help="the bundled model")
    f.set_defaults(run=run)


def run(args) -> int:
    from ..models.sources import fetch_model

    print(fetch_model(args.name))
    return 0

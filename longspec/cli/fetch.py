"""`longspec fetch NAME`: download a bundled model that is fetched on first use, or a data set
(`sharegpt`, chat data for training drafters), now."""

from __future__ import annotations

from ..models.sources import DATA, FETCHED


def add_parser(sub) -> None:
    f = sub.add_parser("fetch", help="download a bundled model now (it is fetched on first use "
                       "otherwise), or a data set")
    f.add_argument("name", choices=sorted([*FETCHED, *DATA]),
                   help="the bundled model, or the data set")
    f.set_defaults(run=run)


def run(args) -> int:
    from ..models.sources import fetch_data, fetch_model

    print(fetch_data(args.name) if args.name in DATA else fetch_model(args.name))
    return 0

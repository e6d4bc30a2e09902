"""`longspec demo`: the main job on the bundled demo model, with no arguments."""

from __future__ import annotations

import sys

from ..sampling import SamplingConfig
from .flags import model_flags

DEMO_PROMPT = '''import os
import sys


class ConfigParser:
    """Read and write configuration files."""

    def __init__(self, path):
'''


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="generate ~2K tokens with the bundled demo model")
    d.add_argument("--max-new-tokens", type=int, default=2048)
    d.add_argument("--method", default="ar")
    model_flags(d)
    d.set_defaults(run=run)


def run(args) -> int:
    from ..api import stream
    from ..models import load_model

    model = load_model("demo", dtype=args.dtype, device=args.device)
    sampling = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024)
    s = stream(model, DEMO_PROMPT, max_new_tokens=args.max_new_tokens, method=args.method,
               sampling=sampling, ignore_eos=True, progress=True)
    sys.stdout.write(DEMO_PROMPT)
    for chunk in s:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    st = s.result.stats
    print(f"\n\n[longspec demo] {st['new_tokens']} tokens in {st['decode_s']:.1f} s "
          f"({st['tokens_per_s']:.0f} tokens/s), method {st['method']}, "
          f"mean accepted length {st['mean_accepted_length']:.2f}, {st['device']} {st['dtype']}")
    return 0

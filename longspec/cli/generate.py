"""`longspec generate`: stream text to stdout (or one JSON object), a progress bar on stderr."""

from __future__ import annotations

import contextlib
import json
import sys

from ..text import read_text_file
from .flags import (
    load_optional,
    method_flags,
    method_from_args,
    model_flags,
    sampling_flags,
    sampling_from_args,
)


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text with a model")
    g.add_argument("model", help="checkpoint directory or bundled name (demo, demo-draft)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file holding the prompt text")
    g.add_argument("--max-new-tokens", type=int, default=256)
    method_flags(g)
    sampling_flags(g)
    model_flags(g)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")
    g.add_argument("--json", action="store_true", help="print one JSON object at the end")
    g.add_argument("--output", help="append the text to FILE as it is generated")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g.set_defaults(run=run)


def run(args) -> int:
    from ..api import stream
    from ..models import load_model

    sampling = sampling_from_args(args)
    _, options = method_from_args(args)
    prompt = args.prompt if args.prompt is not None else read_text_file(args.prompt_file,
                                                                        "prompt file")
    model = load_model(args.model, dtype=args.dtype, device=args.device)
    draft = load_optional(args.draft_model, args.dtype, args.device)
    s = stream(model, prompt, max_new_tokens=args.max_new_tokens, method=args.method,
               sampling=sampling, seed=args.seed, draft_model=draft, heads=args.heads,
               stop=args.stop, ignore_eos=args.ignore_eos, verify=args.verify,
               progress=not args.no_progress, options=options)
    interrupted = False
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(args.output, "a", encoding="utf-8")) if args.output else None
        try:
            for chunk in s:
                if not chunk.text:
                    continue
                if out:
                    out.write(chunk.text)
                    out.flush()
                if not args.json:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            interrupted = True      # keep what was made: the file has it, the JSON gets it
            s.close()
    if args.json:
        r = s.result
        print(json.dumps({"token_ids": r.token_ids, "text": r.text, "stats": r.stats,
                          "interrupted": interrupted}))
    else:
        sys.stdout.write("\n")
    if interrupted:
        print("longspec: interrupted; the text so far was kept", file=sys.stderr)
        return 130
    return 0

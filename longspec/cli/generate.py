"""`longspec generate`: stream text to stdout (or one JSON object), a progress bar on stderr."""

from __future__ import annotations

import json
import sys

from ..models.sources import BUNDLED
from .flags import (
    check_writable,
    constraint_flags,
    constraint_from_args,
    load_from_args,
    load_optional,
    method_flags,
    method_from_args,
    model_flags,
    prompt_flags,
    prompt_from_args,
    sampling_flags,
    sampling_from_args,
)


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text with a model")
    g.add_argument("model", help="checkpoint directory, .gguf file, Hub id or bundled name "
                   f"({', '.join(BUNDLED)})")
    prompt_flags(g)
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--min-new-tokens", type=int, default=0,
                   help="new tokens before an end (EOS, a stop string or token) may come")
    method_flags(g)
    sampling_flags(g)
    model_flags(g)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")
    g.add_argument("--keep-special", action="store_true", help="keep special tokens in the text")
    g.add_argument("--include-stop", action="store_true",
                   help="keep the stop string that ended the run in the text")
    g.add_argument("--prediction-file", metavar="FILE",
                   help="the output expected, mostly (a file to be returned with an edit: "
                   "OpenAI's predicted outputs): `auto` and `suffix` draft from it, and the "
                   "JSON's stats count its accepted and rejected tokens")
    constraint_flags(g)
    g.add_argument("--json", action="store_true", help="print one JSON object at the end")
    g.add_argument("--output", help="append the text to FILE as it is generated, keeping the "
                   "committed tokens in FILE.longspec.json for --resume")
    g.add_argument("--resume", action="store_true", help="continue the run recorded in "
                   "FILE.longspec.json of --output (same command, same settings), even after a "
                   "kill; a new run when there is none")
    g.add_argument("--allow-profile-change", action="store_true",
                   help="with --resume, continue a run written under another kernel profile "
                   "(another CPU, torch, or longspec code that decides the bits: see `longspec "
                   "info`): the tokens from the resume point on are then this profile's, other "
                   "tokens than the uninterrupted run would have written")
    g.add_argument("--checkpoint-every", type=float, default=0.5, metavar="SECONDS",
                   help="at most how often FILE.longspec.json is rewritten (default 0.5)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g.set_defaults(run=run)


def run(args) -> int:
    from ..api import open_prepared
    from ..outputs.text import read_text_file
    from ..request import Request, prepare_request
    from .output import RunOutput

    sampling = sampling_from_args(args)
    _, options = method_from_args(args)
    prompt = prompt_from_args(args)
    if args.resume and not args.output:
        raise ValueError("--resume continues the run written to --output FILE: pass --output")
    if not args.checkpoint_every >= 0:
        raise ValueError(f"--checkpoint-every must be >= 0 seconds, got {args.checkpoint_every}")
    check_writable(args.output, "--output")
    model = load_from_args(args.model, args)
    draft = load_optional(args.draft_model, args)
    settings = {"max_new_tokens": args.max_new_tokens, "min_new_tokens": args.min_new_tokens,
                "method": args.method,
                "sampling": sampling, "seed": args.seed, "draft_model": draft,
                "heads": args.heads, "stop": args.stop, "ignore_eos": args.ignore_eos,
                "verify": args.verify, "options": options, "keep_special": args.keep_special,
                "include_stop": args.include_stop,
                "prediction": (None if args.prediction_file is None
                               else read_text_file(args.prediction_file, "--prediction-file")),
                **constraint_from_args(args)}
    out = None
    if args.output:
        out = RunOutput.open(args.output, model, Request(prompt, **settings), args.resume,
                             args.checkpoint_every, args.allow_profile_change)
    # the prompt as the sidecar's check tokenized it, not tokenized again
    ready = prepare_request(model, Request(prompt, **settings,
                                           resume_from=out.resume_from if out else None),
                            out.checkpoints.record.prompt_ids if out else None)
    s = open_prepared(model, ready, progress=not args.no_progress)
    interrupted = False
    if not args.json:
        sys.stdout.write(s.resumed_text)
    try:
        if out:
            out.start(s)
        for chunk in s:
            if out:
                out.add(chunk)
            if chunk.text and not args.json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        interrupted = True      # keep what was made: the file has it, the JSON gets it
        s.close()
    finally:
        if out:
            out.close(s)
    if args.json:
        r = s.result
        print(json.dumps({"token_ids": r.token_ids, "text": r.text, "stats": r.stats,
                          "finish_reason": r.finish_reason, "prompt_tokens": r.prompt_tokens}))
    else:
        sys.stdout.write("\n")
    if interrupted:
        hint = "; continue it with --resume" if out else ""
        print(f"longspec: interrupted; the text so far was kept{hint}", file=sys.stderr)
        return 130
    return 0

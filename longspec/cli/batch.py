"""`longspec batch`: one generation per line of a JSONL file, the results as JSONL (batch.py)."""

from __future__ import annotations

from ..engine.batching import DEFAULT_MAX_BATCH
from ..jobs.batch_job import LINE_SETTINGS
from ..models.sources import BUNDLED
from .flags import (
    check_writable,
    load_from_args,
    load_optional,
    method_flags,
    method_from_args,
    model_args,
    model_flags,
    sampling_flags,
    sampling_from_args,
)


def add_parser(sub) -> None:
    g = sub.add_parser("batch", help="generate for every line of a JSONL file, resumably",
                       description="Each line of PROMPTS is a JSON object: \"prompt\" (text or "
                       "token ids) or \"messages\", an optional \"id\", and settings of its own "
                       f"({', '.join(LINE_SETTINGS)}) over the flags'. "
                       "Results go to --out, a JSON line each, in order. Run the same command "
                       "again after an interruption (a kill included): finished "
                       "lines are kept, those under way continue token-identically.")
    g.add_argument("model", help="checkpoint directory, .gguf file, Hub id or bundled name "
                   f"({', '.join(BUNDLED)})")
    g.add_argument("prompts", help="the JSONL file of prompts")
    g.add_argument("--out", required=True, help="the JSONL file of results (appended to; the "
                   "sidecars OUT.lineN.longspec.json hold the lines under way)")
    g.add_argument("--max-new-tokens", type=int, default=256)
    method_flags(g)
    sampling_flags(g)
    model_flags(g, prompt_cache=True)
    g.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")
    g.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, metavar="N",
                   help="lines generated together, their drafts verified in one forward "
                   "(default %(default)s)")
    g.add_argument("--checkpoint-every", type=float, default=0.5, metavar="SECONDS",
                   help="at most how often the sidecar is rewritten (default 0.5)")
    g.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    g.add_argument("--ray", metavar="ADDRESS", help="spread the lines over Ray actors, one "
                   "loaded model each: the address of a Ray cluster (`auto`: the one this "
                   "machine is part of), or `local` to start one here (pip install -e "
                   "\".[ray]\")")
    g.add_argument("--ray-actors", type=int, default=2, metavar="N",
                   help="with --ray: how many actors (models) generate at once (default 2)")
    g.set_defaults(run=run)


def run(args) -> int:
    from dataclasses import replace

    from ..jobs.batch_job import Line, read_lines, run_job
    from ..request import Request

    _, options = method_from_args(args)
    check_writable(args.out, "--out")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be at least 1, got {args.max_batch}")
    job = Request(None, max_new_tokens=args.max_new_tokens, method=args.method,
                  sampling=sampling_from_args(args), seed=args.seed, heads=args.heads,
                  ignore_eos=args.ignore_eos, verify=args.verify, options=options)
    lines = read_lines(args.prompts, job)        # every line checked before a model loads
    if args.ray:
        return run_on_ray(args, lines)
    model = load_from_args(args.model, args)
    draft = load_optional(args.draft_model, args)
    if draft is not None:
        lines = [Line(line.id, replace(line.request, draft_model=draft)) for line in lines]
    for _ in run_job(model, lines, args.out, progress=not args.no_progress,
                       checkpoint_every=args.checkpoint_every, max_batch=args.max_batch):
        pass
    return 0


def run_on_ray(args, lines) -> int:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ValueError("--ray needs the ray package: pip install -e \".[ray]\"")
    if args.ray_actors < 1:
        raise ValueError(f"--ray-actors must be at least 1, got {args.ray_actors}")
    from ..jobs.ray_job import run_job_ray

    draft = None if args.draft_model is None else model_args(args.draft_model, args)
    for _ in run_job_ray(args.ray, args.ray_actors, model_args(args.model, args), draft, lines,
                           args.out, progress=not args.no_progress, max_batch=args.max_batch):
        pass
    return 0

"""`longspec bench`: methods and transformers' generate side by side."""

from __future__ import annotations

from pathlib import Path

from .flags import load_from_args, load_optional, model_flags, sampling_flags, sampling_from_args


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmark methods and transformers side by side")
    b.add_argument("model", help="checkpoint directory or bundled name")
    b.add_argument("--methods", default="ar,pld,recycling,hf",
                   help="comma-separated: our methods (NAME or NAME[key=value,...]) and hf, "
                   "hf-pld, hf-assisted")
    b.add_argument("--gen-lens", default="256,1024", help="comma-separated numbers of new tokens")
    b.add_argument("--prompt-len", type=int, default=1024)
    b.add_argument("--prompt-file", help="prompt text (default: held-out Python source)")
    b.add_argument("--runs", type=int, default=1)
    b.add_argument("--out", default="bench-out")
    b.add_argument("--draft-model", help="draft model (draft, triforce, hf-assisted)")
    b.add_argument("--heads", metavar="DIR", help="trained drafter directory (heads, "
                   "tokenswift: multi-token heads; eagle: an EAGLE drafter; one directory may "
                   "hold both)")
    b.add_argument("--option", action="append", default=[], metavar="[METHOD:]KEY=VALUE")
    b.add_argument("--no-progress", action="store_true")
    sampling_flags(b)
    model_flags(b)
    b.set_defaults(run=run)


def int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None


def run(args) -> int:
    from ..bench.main import run_bench
    from ..bench.runner import split_entries

    sampling = sampling_from_args(args)
    gen_lens = int_list(args.gen_lens, "--gen-lens")
    model = load_from_args(args.model, args)
    draft = load_optional(args.draft_model, args)
    methods = split_entries(args.methods)
    written = run_bench(model, draft_model=draft, heads=args.heads, methods=methods,
                        gen_lens=gen_lens, prompt_len=args.prompt_len,
                        prompt_file=args.prompt_file, sampling=sampling, seed=args.seed,
                        runs=args.runs, out=Path(args.out), options=args.option,
                        progress=not args.no_progress)
    print(Path(args.out, "results.md").read_text())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0

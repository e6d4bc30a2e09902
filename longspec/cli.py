"""Command line: generate, demo, train-tiny (and the commands of later modules).

Bad input gets one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from pathlib import Path

from .heads.train import HeadsTraining
from .sampling import SamplingConfig

DEMO_PROMPT = '''import os
import sys


class ConfigParser:
    """Read and write configuration files."""

    def __init__(self, path):
'''


def _sampling_flags(p: argparse.ArgumentParser) -> None:
    defaults = SamplingConfig()
    g = p.add_argument_group("sampling (temperature 0 is greedy)")
    g.add_argument("--temperature", type=float, default=defaults.temperature)
    g.add_argument("--top-p", type=float, default=defaults.top_p)
    g.add_argument("--top-k", type=int, default=defaults.top_k)
    g.add_argument("--min-p", type=float, default=defaults.min_p)
    g.add_argument("--eta", type=float, default=defaults.eta)
    g.add_argument("--penalty", type=float, default=defaults.penalty,
                   help="contextual penalty on tokens of the last --penalty-window tokens (1 = off)")
    g.add_argument("--penalty-window", type=int, default=defaults.penalty_window)
    g.add_argument("--seed", type=int, default=0)


def sampling_from_args(args) -> SamplingConfig:
    return SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          min_p=args.min_p, eta=args.eta, penalty=args.penalty,
                          penalty_window=args.penalty_window).validate()


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")


def _method_flags(p: argparse.ArgumentParser) -> None:
    from .drafters import method_names

    p.add_argument("--method", default="ar", help=f"one of: {', '.join(method_names())}")
    p.add_argument("--draft-model", help="draft model directory or bundled name (draft, triforce)")
    p.add_argument("--heads", help="multi-token heads directory (heads, tokenswift)")
    p.add_argument("--verify", default="match", choices=("match", "rejection"))
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="method tuning, e.g. max_nodes=16 (repeatable; see README)")


def parse_options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option takes KEY=VALUE, got {pair!r}")
        options[key] = int(value) if value.lstrip("-").isdigit() else value
    return options


class _Parser(argparse.ArgumentParser):
    """Usage mistakes end in one line on stderr, like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="longspec", description="Lossless speculative decoding for long generation.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text with a model")
    g.add_argument("model", help="checkpoint directory or bundled name (demo, demo-draft)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file holding the prompt text")
    g.add_argument("--max-new-tokens", type=int, default=256)
    _method_flags(g)
    _sampling_flags(g)
    _model_flags(g)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")
    g.add_argument("--json", action="store_true", help="print one JSON object at the end")
    g.add_argument("--output", help="append the text to FILE as it is generated")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    d = sub.add_parser("demo", help="generate ~2K tokens with the bundled demo model")
    d.add_argument("--max-new-tokens", type=int, default=2048)
    d.add_argument("--method", default="ar")
    _model_flags(d)

    b = sub.add_parser("bench", help="benchmark methods and transformers side by side")
    b.add_argument("model", help="checkpoint directory or bundled name")
    b.add_argument("--methods", default="ar,pld,recycling,hf",
                   help="comma-separated: our methods (NAME or NAME[key=value,...]) and hf, hf-pld, hf-assisted")
    b.add_argument("--gen-lens", default="256,1024", help="comma-separated numbers of new tokens")
    b.add_argument("--prompt-len", type=int, default=1024)
    b.add_argument("--prompt-file", help="prompt text (default: held-out Python source)")
    b.add_argument("--runs", type=int, default=1)
    b.add_argument("--out", default="bench-out")
    b.add_argument("--draft-model", help="draft model (draft, triforce, hf-assisted)")
    b.add_argument("--heads", help="multi-token heads directory (heads, tokenswift)")
    b.add_argument("--option", action="append", default=[], metavar="[METHOD:]KEY=VALUE")
    b.add_argument("--no-progress", action="store_true")
    _sampling_flags(b)
    _model_flags(b)

    h = sub.add_parser("train-heads", help="train multi-token heads for a model (backbone frozen)")
    h.add_argument("model", help="checkpoint directory or bundled name")
    h.add_argument("--data", nargs="+", required=True, metavar="FILE", help="training text files")
    h.add_argument("--out", required=True, help="directory for heads.safetensors and heads.json")
    defaults = HeadsTraining()
    h.add_argument("--steps", type=int, default=defaults.steps)
    h.add_argument("--lr", type=float, default=defaults.lr)
    h.add_argument("--batch-size", type=int, default=defaults.batch_size)
    h.add_argument("--seq-len", type=int, default=defaults.seq_len)
    h.add_argument("--target", choices=("text", "distill"), default=defaults.target,
                   help="learn the text's tokens, or the model's own predictions")
    h.add_argument("--seed", type=int, default=0)
    _model_flags(h)

    t = sub.add_parser("train-tiny", help="train the demo tokenizer, target and draft models")
    t.add_argument("--out", default=None, help="output directory (default: the bundled location)")
    t.add_argument("--target-steps", type=int, default=None)
    t.add_argument("--draft-steps", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    return parser


def _read_prompt(args) -> str:
    if args.prompt is not None:
        return args.prompt
    path = Path(args.prompt_file)
    if not path.is_file():
        raise ValueError(f"prompt file {args.prompt_file!r} not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"prompt file {args.prompt_file!r} is not UTF-8 text") from None


def _load_optional(path: str | None, dtype: str, device: str):
    from .models import load_model

    return None if path is None else load_model(path, dtype=dtype, device=device)


def cmd_generate(args) -> int:
    from .api import stream
    from .models import load_model

    sampling = sampling_from_args(args)
    prompt = _read_prompt(args)
    model = load_model(args.model, dtype=args.dtype, device=args.device)
    draft = _load_optional(args.draft_model, args.dtype, args.device)
    s = stream(model, prompt, max_new_tokens=args.max_new_tokens, method=args.method,
               sampling=sampling, seed=args.seed, draft_model=draft, heads=args.heads,
               stop=args.stop, ignore_eos=args.ignore_eos, verify=args.verify,
               progress=not args.no_progress, options=parse_options(args.option))
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


def cmd_demo(args) -> int:
    from .api import stream
    from .models import load_model

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


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None


def cmd_bench(args) -> int:
    from .bench.main import run_bench
    from .models import load_model

    sampling = sampling_from_args(args)
    gen_lens = _int_list(args.gen_lens, "--gen-lens")
    model = load_model(args.model, dtype=args.dtype, device=args.device)
    draft = _load_optional(args.draft_model, args.dtype, args.device)
    methods = [m for m in re.split(r",(?![^\[]*\])", args.methods) if m.strip()]
    written = run_bench(model, draft, args.heads, methods, gen_lens, args.prompt_len, args.prompt_file,
                        sampling, args.seed, args.runs, Path(args.out), args.option,
                        progress=not args.no_progress)
    print(Path(args.out, "results.md").read_text())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def cmd_train_heads(args) -> int:
    from .heads.train import train_heads
    from .models import load_model

    cfg = HeadsTraining(steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                        seq_len=args.seq_len, target=args.target, seed=args.seed).validate()
    model = load_model(args.model, dtype=args.dtype, device=args.device)
    record = train_heads(model, args.data, cfg, out=args.out)
    print(f"held-out loss {record['held_out_loss_before']} -> {record['held_out_loss_after']} "
          f"in {record['seconds']:.0f} s; heads saved to {args.out}")
    return 0


def cmd_train_tiny(args) -> int:
    from .models.loader import demo_path
    from .zoo.train import build_demo_models

    out = Path(args.out) if args.out else demo_path("demo").parent
    build_demo_models(out, target_steps=args.target_steps, draft_steps=args.draft_steps, seed=args.seed)
    return 0


COMMANDS = {"generate": cmd_generate, "demo": cmd_demo, "bench": cmd_bench, "train-heads": cmd_train_heads,
            "train-tiny": cmd_train_tiny}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ValueError, OSError) as e:
        print(f"longspec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nlongspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`longspec train-drafter` (and its alias `train-heads`, the heads kind), `longspec answers`
(self-distillation data for it) and `longspec train-tiny`."""

from __future__ import annotations

from pathlib import Path

from ..heads import store
from ..heads.store import KINDS
from ..training.drafters import LR, PRECISIONS, TARGETS, DrafterTraining, report_drafter
from .flags import load_from_args, model_flags, sampling_flags, sampling_from_args


def _drafter_flags(p, kind: str | None) -> None:
    p.add_argument("model", help="checkpoint directory, GGUF file, Hub id or bundled name")
    if kind is None:
        p.add_argument("--kind", required=True, choices=KINDS,
                       help="eagle: a one-layer feature drafter (method eagle); heads: "
                            "multi-token heads (methods heads, tokenswift)")
    else:
        p.set_defaults(kind=kind)
    p.add_argument("--data", nargs="+", default=[], metavar="PATH",
                   help="training text: files, or directories (their .py/.txt/.md/.rst files)")
    p.add_argument("--sharegpt", type=int, default=0, metavar="TOKENS",
                   help="train on this many tokens of ShareGPT's conversations through the "
                        "model's chat template instead (fetched on first use; answers only "
                        "are learned; held out: other conversations)")
    p.add_argument("--answers", default="", metavar="DIR",
                   help="with --sharegpt: the model's own answers to ShareGPT's questions "
                        "(longspec answers --sharegpt) in place of the conversations they "
                        "answer")
    p.add_argument("--out", default=None,
                   help="directory for the drafter (<kind>.safetensors, <kind>.json), its "
                        "checkpoint and the target's features; a run there with the same "
                        "settings continues where the last stopped (default: "
                        "$LONGSPEC_HOME/drafters/<the model's fingerprint>/, where the model's "
                        "methods find it)")
    d = DrafterTraining()
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=None,
                   help=", ".join(f"{k}: {v:g}" for k, v in LR.items()) + " by default")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--target", choices=TARGETS, default=d.target,
                   help="learn the model's own predictions (distill) or the text's tokens")
    p.add_argument("--gamma", type=int, default=d.gamma, help="heads: how many")
    p.add_argument("--draft-vocab", type=int, default=d.draft_vocab, metavar="N",
                   help="eagle: guess among the N most frequent tokens of the data only (a "
                        "smaller, faster LM head product; 0: the whole vocabulary)")
    p.add_argument("--eagle-mlp", type=int, default=d.eagle_mlp, metavar="N",
                   help="eagle: the width of its MLP (0: the model's; narrower drafts faster "
                        "and ships smaller)")
    p.add_argument("--ttt-steps", type=int, default=d.ttt_steps, metavar="K",
                   help="eagle: unroll the drafter K steps over its own guesses in training "
                        "(training-time test)")
    p.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                   help="the drafter's products in training: bfloat16 (autocast; weights and "
                        "optimizer in float32) or float32; auto: bfloat16 where the CPU has "
                        "bfloat16 dot products (AVX512_BF16, AMX) or on CUDA")
    p.add_argument("--report", action="store_true",
                   help="eagle: train nothing; print the held-out acceptance per depth of the "
                        "drafter in --out on this data")
    p.add_argument("--features-only", action="store_true",
                   help="run the target over the data and keep its features in --out (resumable; "
                        "the trainings that follow on the same data and --seq-len read them), "
                        "then stop")
    p.add_argument("--keep-features", action="store_true",
                   help="keep the target's features in --out after training (for a training of "
                        "the other kind on the same data)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, metavar="STEPS")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-progress", action="store_true")
    model_flags(p)
    p.set_defaults(run=run_train_drafter)


def add_parsers(sub) -> None:
    _drafter_flags(sub.add_parser("train-drafter", help="train a drafter for a model (EAGLE "
                                  "feature drafter or multi-token heads; the model frozen)"),
                   None)
    _drafter_flags(sub.add_parser("train-heads", help="train multi-token heads for a model "
                                  "(train-drafter --kind heads)"), "heads")

    a = sub.add_parser("answers", help="write the model's own chat answers to instructions as "
                       "training text for its drafters (self-distillation)")
    a.add_argument("model", help="checkpoint directory, GGUF file, Hub id or bundled name")
    asked = a.add_mutually_exclusive_group(required=True)
    asked.add_argument("--instructions", metavar="FILE", help="one instruction per line")
    asked.add_argument("--sharegpt", type=int, metavar="COUNT",
                       help="the first questions of COUNT ShareGPT conversations (fetched on "
                            "first use), for train-drafter --sharegpt --answers")
    a.add_argument("--out", required=True, help="directory for answer-NNNN.txt (sharegpt-NNNNN"
                   ".json; existing files are kept, so a second run continues an interrupted "
                   "one)")
    a.add_argument("--max-new-tokens", type=int, default=1024)
    a.add_argument("--method", default="auto", help="how to generate (every method writes "
                   "the same text)")
    a.add_argument("--no-progress", action="store_true")
    sampling_flags(a)
    model_flags(a)
    a.set_defaults(run=run_answers)

    t = sub.add_parser("train-tiny", help="train the demo tokenizer, target and draft models")
    t.add_argument("--out", default=None, help="output directory (default: the bundled location)")
    t.add_argument("--target-steps", type=int, default=None)
    t.add_argument("--draft-steps", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(run=run_train_tiny)


def run_train_drafter(args) -> int:
    from ..training.drafters import features_only, train_drafter

    cfg = DrafterTraining(kind=args.kind, steps=args.steps, lr=args.lr,
                          warmup_steps=args.warmup_steps, batch_size=args.batch_size,
                          seq_len=args.seq_len, target=args.target, gamma=args.gamma,
                          draft_vocab=args.draft_vocab, eagle_mlp=args.eagle_mlp,
                          ttt_steps=args.ttt_steps,
                          sharegpt=args.sharegpt, answers=args.answers,
                          checkpoint_every=args.checkpoint_every,
                          precision=args.precision, seed=args.seed).validate()
    if not args.data and not cfg.sharegpt:
        raise ValueError("give the training text: --data PATH... or --sharegpt TOKENS")
    if args.report and cfg.kind != "eagle":
        raise ValueError("--report measures an eagle drafter (--kind eagle)")
    model = load_from_args(args.model, args)
    if args.out is None:
        args.out = str(store.user_dir(model))
    if args.report:
        print_report(report_drafter(model, args.data, cfg, args.out,
                                    progress=not args.no_progress))
        return 0
    if args.features_only:
        done = features_only(model, args.data, cfg, args.out, progress=not args.no_progress)
        print(f"target features: {done['tokens']} tokens ({done['windows'][0]} training and "
              f"{done['windows'][1]} held-out windows of {cfg.seq_len}), "
              f"{done['bytes'] / 2**20:.0f} MiB in {args.out}, {done['seconds']:.0f} s")
        return 0
    record = train_drafter(model, args.data, cfg, out=args.out, progress=not args.no_progress,
                           keep_features=args.keep_features)
    depths = ", ".join(f"{a:.3f}" for a in record["agreement_after"])
    before = ", ".join(f"{a:.3f}" for a in record["agreement_before"])
    what = "top-1 agreement with the model" if cfg.kind == "heads" else "greedy acceptance"
    print(f"held-out loss {record['held_out_loss_before']} -> {record['held_out_loss_after']}; "
          f"{what} per depth {before} -> {depths}; "
          f"{record['seconds']:.0f} s; {cfg.kind} drafter saved to {args.out}")
    if "held_out_acceptance" in record:
        print_report(record["held_out_acceptance"])
    return 0


def print_report(rates: dict) -> None:
    """The held-out acceptance table of an EAGLE drafter."""
    kinds = [k for k in rates if isinstance(rates[k], list)]
    print(f"held-out acceptance per depth ({rates['answer_tokens']} answer tokens; depth k "
          "given k-1 accepted):")
    print(f"{'depth':>6} " + " ".join(f"{k:>14}" for k in kinds))
    for d in range(rates["depths"]):
        print(f"{d + 1:>6} " + " ".join(f"{rates[k][d]:>14.3f}" for k in kinds))
    print(f"{'mean tokens a step':>6} " + " ".join(f"{rates[k + '_mean_accepted']:>7.2f}"
                                                   for k in kinds))


def run_answers(args) -> int:
    from ..training.answers import read_instructions, write_answers, write_sharegpt_answers

    if args.sharegpt is not None and args.sharegpt < 1:
        raise ValueError(f"--sharegpt takes a number of conversations, got {args.sharegpt}")
    instructions = read_instructions(args.instructions) if args.instructions else None
    sampling = sampling_from_args(args)
    model = load_from_args(args.model, args)
    how = {"max_new_tokens": args.max_new_tokens, "sampling": sampling, "seed": args.seed,
           "method": args.method, "progress": not args.no_progress}
    if instructions is None:
        paths = write_sharegpt_answers(model, args.sharegpt, args.out, **how)
    else:
        paths = write_answers(model, instructions, args.out, **how)
    print(f"{len(paths)} answers in {args.out}")
    return 0


def run_train_tiny(args) -> int:
    from ..models.loader import demo_path
    from ..training.demo import build_demo_models

    out = Path(args.out) if args.out else demo_path("demo").parent
    build_demo_models(out, target_steps=args.target_steps, draft_steps=args.draft_steps,
                      seed=args.seed)
    return 0

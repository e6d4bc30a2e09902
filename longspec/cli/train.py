"""`longspec train-heads` and `longspec train-tiny`."""

from __future__ import annotations

from pathlib import Path

from ..heads.train import HeadsTraining
from .flags import load_from_args, model_flags


def add_parsers(sub) -> None:
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
    model_flags(h)
    h.set_defaults(run=run_train_heads)

    t = sub.add_parser("train-tiny", help="train the demo tokenizer, target and draft models")
    t.add_argument("--out", default=None, help="output directory (default: the bundled location)")
    t.add_argument("--target-steps", type=int, default=None)
    t.add_argument("--draft-steps", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(run=run_train_tiny)


def run_train_heads(args) -> int:
    from ..heads.train import train_heads

    cfg = HeadsTraining(steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                        seq_len=args.seq_len, target=args.target, seed=args.seed).validate()
    model = load_from_args(args.model, args)
    record = train_heads(model, args.data, cfg, out=args.out)
    print(f"held-out loss {record['held_out_loss_before']} -> {record['held_out_loss_after']} "
          f"in {record['seconds']:.0f} s; heads saved to {args.out}")
    return 0


def run_train_tiny(args) -> int:
    from ..models.loader import demo_path
    from ..zoo.train import build_demo_models

    out = Path(args.out) if args.out else demo_path("demo").parent
    build_demo_models(out, target_steps=args.target_steps, draft_steps=args.draft_steps,
                      seed=args.seed)
    return 0

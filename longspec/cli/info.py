"""`longspec info MODEL`: what a model is and the kernel profile it runs with here."""

from __future__ import annotations

import json

from .flags import load_from_args, model_flags


def add_parser(sub) -> None:
    i = sub.add_parser("info", help="load a model and print its shape and the kernel profile it "
                       "runs with on this machine (what exact token equality rests on)")
    i.add_argument("model", help="checkpoint directory, .gguf file, Hub id or bundled name")
    model_flags(i)
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(run=run)


def run(args) -> int:
    model = load_from_args(args.model, args)
    c = model.config
    summary = {"model": model.name, "path": str(model.path), "architecture": c.model_type,
               "layers": c.num_layers, "hidden": c.hidden_size,
               "heads": f"{c.num_heads} query / {c.num_kv_heads} key-value, {c.head_dim} wide",
               "vocab": c.vocab_size, "context": c.context_limit}
    profile = model.profile.as_dict() if model.profile is not None else {}
    if profile:
        summary["speculation"] = profile["speculation"]
    if args.json:
        print(json.dumps({**summary, "kernel_profile": profile}, indent=2))
        return 0
    width = max(map(len, [*summary, *profile]))
    for key, value in summary.items():
        print(f"{key:<{width}}  {value}")
    print("\nkernel profile (tokens are identical across methods within one profile; another "
          "profile may write other tokens):")
    for key, value in profile.items():
        print(f"  {key:<{width}}  {value}")
    return 0

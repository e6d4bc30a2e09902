"""How much of a model's answers its K most frequent tokens cover: a draft vocabulary's size.

How much of a model's answers a reduced draft vocabulary covers (EAGLE-3 drafts over the most
frequent tokens only, mapped back to the full vocabulary).

The answer tokens of ShareGPT's training conversations (`longspec fetch sharegpt`; the first
--conversations of them) are counted; each row gives, for the K most frequent, the share of the
held-out conversations' answer tokens they hold: the best acceptance a drafter over those K
tokens could have (a token outside them is never proposed).

    python benchmarks/draft_vocab.py --model smollm2 --conversations 4000
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import longspec
from longspec.models.sources import fetch_data
from longspec.zoo.sharegpt import conversations, held_out

SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768)


def answer_tokens(tokenizer, texts: list[str]) -> Counter:
    counts = Counter()
    for start in range(0, len(texts), 256):
        for ids in tokenizer(texts[start:start + 256], add_special_tokens=False)["input_ids"]:
            counts.update(ids)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--conversations", type=int, default=4000,
                    help="training conversations counted")
    args = ap.parse_args()
    tokenizer = longspec.load_model(args.model, device="cpu").tokenizer
    begin = time.perf_counter()
    train, test = [], []
    for c in conversations(fetch_data("sharegpt")):
        (test if held_out(c) else train).append(c)
    train = train[:args.conversations]
    counts = answer_tokens(tokenizer, [a for c in train for a in c.answers()])
    held = answer_tokens(tokenizer, [a for c in test for a in c.answers()])
    total = sum(held.values())
    ranked = [token for token, _ in counts.most_common()]
    print(f"{args.model}: vocabulary {len(tokenizer)}; {len(train)} training conversations "
          f"({sum(counts.values()):,} answer tokens, {len(counts):,} distinct), {len(test)} "
          f"held out ({total:,} answer tokens); {time.perf_counter() - begin:.0f} s")
    print("| draft vocabulary (most frequent) | held-out answer tokens covered |")
    print("|---|---|")
    for k in SIZES:
        if k <= len(ranked):
            kept = set(ranked[:k])
            covered = sum(n for token, n in held.items() if token in kept)
            print(f"| {k:,} | {covered / total:.2%} |")


if __name__ == "__main__":
    main()

"""Step costs at real shapes with random weights, and the tokens/s they would give (gpu_check).

Step costs at real shapes with random weights (part c of gpu_check.py), and the tokens/s
they would give with acceptance measured on a CPU (part d): the milliseconds of one target
forward over a tree of each row count at each context, on each attention path, beside the
floor of reading every weight and the cache's keys and values once. Random weights give
costs only, never speedups (their loops feed the suffix drafters)."""

from __future__ import annotations

import statistics
import time
from typing import Protocol

import torch

from longspec.bench.metrics import measure_bandwidth
from longspec.cache import StaticCache
from longspec.models.build import build_transformer
from longspec.models.config import config_from_hf
from longspec.models.graphs import StaticSteps
from longspec.state.captures import Captures
from longspec.step.tree import DraftTree, TreeTemplate

# the shapes of (c): Hugging Face config fields (default rotary embedding: costs only)
SHAPES = {
    "qwen2.5-1.5b": {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
                     "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2,
                     "tie_word_embeddings": True, "max_position_embeddings": 131072},
    "llama-3.1-8b": {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8,
                     "max_position_embeddings": 131072},
}
DRY_SHAPES = {"tiny": {"model_type": "llama", "vocab_size": 512, "hidden_size": 128,
                       "intermediate_size": 256, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "num_key_value_heads": 2,
                       "max_position_embeddings": 4096}}
ROWS = (1, 16, 64)
DRY_ROWS = (1, 16)     # the dry run's (Triton's interpreter runs a row's programs in ms)
# Tokens a step of `auto` verifying trees of exactly 16 and 64 nodes, Qwen2.5-Coder-1.5B in
# TokenSwift's setting, 1,024 tokens, every run identical to `ar` (docs/benchmarks/cuda.md,
# "Acceptance of fixed trees"; greedy: 2.27 and 2.64)
ACCEPTANCE = "16=1.81,64=2.17"
TREE_DEPTH = 8


class Recorder(Protocol):
    """Where results go (gpu_check.py's Report): each entry as it comes, and whether time is
    left for the next."""

    def time_left(self, what: str) -> bool: ...

    def add(self, part: str, entry: dict) -> None: ...


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_net(fields: dict, dtype: torch.dtype, device: torch.device):
    """A network of these Hugging Face config fields with random weights (norms of one)."""
    c = config_from_hf(fields)
    gen = torch.Generator(device).manual_seed(0)
    h, d, inter = c.hidden_size, c.head_dim, c.intermediate_size

    def rand(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype) * 0.02

    tensors = {"embed_tokens.weight": rand(c.vocab_size, h), "norm.weight": rand(h) + 1}
    if not c.tie_word_embeddings:
        tensors["lm_head.weight"] = rand(c.vocab_size, h)
    for i in range(c.num_layers):
        p = f"layers.{i}."
        shapes = {"self_attn.q_proj": (c.num_heads * d, h),
                  "self_attn.k_proj": (c.num_kv_heads * d, h),
                  "self_attn.v_proj": (c.num_kv_heads * d, h),
                  "self_attn.o_proj": (h, c.num_heads * d),
                  "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
                  "mlp.down_proj": (h, inter)}
        tensors.update({p + name + ".weight": rand(*shape) for name, shape in shapes.items()})
        if c.model_type == "qwen2":
            tensors.update({p + f"self_attn.{x}_proj.bias": rand(shape[0]) for x, shape in
                            (("q", shapes["self_attn.q_proj"]), ("k", shapes["self_attn.k_proj"]),
                             ("v", shapes["self_attn.v_proj"]))})
        tensors[p + "input_layernorm.weight"] = rand(h) + 1
        tensors[p + "post_attention_layernorm.weight"] = rand(h) + 1
    return build_transformer(c, tensors, dtype, device)


def step_ms(net, cache, rows: int, repeats: int, steps: StaticSteps | None
            ) -> tuple[float, float]:
    """Median milliseconds of a forward over a `rows`-node tree and the argmax of its logits
    (through `steps`, its bucket: captured on CUDA first), and the first one's seconds (with
    `steps`, the capture's)."""
    shape = TreeTemplate(rows, min(rows - 1, TREE_DEPTH), net.device).shape
    tree = DraftTree(shape, torch.randint(0, net.config.vocab_size, (rows,), device=net.device))
    mask = shape.mask(net.dtype) if rows > 1 else None
    positions = shape.depth + cache.length
    times = []
    for _ in range(repeats + 1):
        sync(net.device)
        begin = time.perf_counter()
        if steps is None:
            net(tree.tokens, positions, cache, mask).logits.argmax(-1).tolist()
        elif not times:
            steps.capture(rows)
        else:
            steps(tree, repeats).logits.argmax(-1).tolist()
        times.append(time.perf_counter() - begin)
    return 1e3 * statistics.median(times[1:]), times[0]


def step_costs(report: Recorder, device: torch.device, shapes: dict, contexts: list[int],
               row_counts: tuple[int, ...], paths: list[str], repeats: int, costs: dict) -> None:
    """Each (shape, context, path, rows)'s milliseconds, into `costs` as they come."""
    bandwidth = measure_bandwidth(device)
    for name, fields in shapes.items():
        if not report.time_left(f"step costs {name}"):
            break
        net = random_net(fields, torch.bfloat16, device)
        c = net.config
        # a step reads every layer's weights and the head (the embedding's rows only)
        weights = (sum(t.numel() * t.element_size() for t in
                       (*net.layers.parameters(), *net.layers.buffers()))
                   + c.vocab_size * c.hidden_size * net.dtype.itemsize)
        for context in contexts:
            cache = StaticCache(c, context + max(row_counts) + 1, torch.bfloat16, device)
            cache.commit(context)
            kv = context * c.kv_bytes_per_token(2)
            floor = 1e3 * (weights + kv) / bandwidth
            for path in paths:
                net.attention = path.removesuffix("+graphs")
                steps = StaticSteps(net, cache, Captures()) if path.endswith("+graphs") else None
                for rows in row_counts:
                    if not report.time_left(f"step costs {name} {context} {path} {rows}"):
                        return
                    ms, first_s = step_ms(net, cache, rows, repeats, steps)
                    costs[(name, context, path, rows)] = ms
                    report.add("step_costs", {
                        "shape": name, "context": context, "attention": path, "rows": rows,
                        "ms": round(ms, 3), "floor_ms": round(floor, 3),
                        "over_floor": round(ms / floor, 2), "first_s": round(first_s, 2)})
            del cache
        del net
        if device.type == "cuda":
            torch.cuda.empty_cache()


def projected(report: Recorder, costs: dict, acceptance: dict[int, float]) -> None:
    """Tokens/s that the step costs at the longest context give with the acceptance measured
    on a CPU (tokens a step for a tree of each row count), against one row a step."""
    if not costs:
        return
    longest = max(context for _, context, _, _ in costs)
    for (name, context, path, rows), ms in costs.items():
        if context == longest and rows in acceptance and (name, context, path, 1) in costs:
            plain = 1e3 / costs[(name, context, path, 1)]
            tokens_per_s = acceptance[rows] * 1e3 / ms
            report.add("projected", {
                "shape": name, "context": context, "attention": path, "rows": rows,
                "tokens_a_step": acceptance[rows], "projected_tokens_per_s": round(tokens_per_s),
                "projected_speedup": round(tokens_per_s / plain, 2)})

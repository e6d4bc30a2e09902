"""The row check at load: on this host, at the model's shapes, is every row of a draft tree
bitwise what its token gets run alone after its ancestors?

Exactness rests on that (attention.py, linear.py), and the kernels' row rules were measured on
particular CPUs and torch versions. So a model checks it once per host (the CPU, or the GPU),
kernel profile (torch, longspec and the digest of the code that decides bits: profile.py) and
model shape (the answer is kept in longspec's cache directory): CHAIN tokens run one at a time
after CONTEXT cache slots give each depth's logits; then draft trees of every row count in
ROWS over the same slots, each a chain with leaves that repeat its nodes (a leaf hung off depth
d carries depth d + 1's token, so its path is that node's), must give every node its depth's
logits, bit for bit.

Paths are checked in turn until one passes: the compiled layers, the Python layers, the Python
layers with attention as products (`_paths`); taking a later one warns once. Where none
passes, the model keeps its first and decodes without speculation (every method as `ar`:
api.py), which the profile, every result's stats, `longspec info` and the server's /health
say.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from ..cache.base import CHUNK, copy_slots
from ..cache.full import StaticCache
from ..state.shared import write_json
from ..step.tree import TreeShape
from .linear import CUDA_ROWS
from .prefill import prefill
from .profile import KernelProfile, kernel_profile
from .sources import longspec_home

# Cache slots before the trees: their blocks start 2 slots before the end of the second CHUNK,
# so every tree of 3 rows or more crosses into a third: its rows sum three chunks' partials (the
# pairwise combine pads them to 4), and its leaves read their ancestors in two chunks past the
# one all rows share (attention.py's tree tail, native.cpp's per-row slots). The slots hold a
# PROMPT-token prefill's keys and values over and over: what they hold does not matter, only
# that a tree's rows and the tokens alone read the same ones (a prefill of them all would take
# most of the check's time).
CONTEXT = 2 * CHUNK - 2
PROMPT = 32
CHAIN = 8        # depths run alone; the trees' chains are at most this long
# The trees' row counts, reaching every class of rows the kernels treat apart:
# - int4_mm.cpp's `product`: blocks of 8 rows (tile<8>), then one block of the 1 to 7 left:
#   2, 3, 4, 5, 7, 8, 9, 13 rows run every tile, alone and after others;
# - dense products (linear.py's DenseLinear, native.cpp's `linear`): fewer rows than MIN_ROWS
#   or min_rows padded (the token alone), up to MAX_ROWS as one product, whose kernel MKL and
#   oneDNN pick by row count (1-3, 4, 8, 12 and more), more in MAX_ROWS-row parts (40);
# - native.cpp's attention loops: a head's rows (its query heads x the tokens) scored 4 at a
#   time and summed with the values in blocks of 3 or 6 where there are that many (and, with
#   AVX-512's bfloat16 dot products, 6 for multiples of 6), else of 4 (`row_block`): 1 to 6
#   tokens reach each with 1 to 4 query heads a key head;
# - attention.py's products: float32 rows rounded up to 4, 8 or 12 or kept (`_row_bucket`),
#   bfloat16 ones to min_rows.
# On CUDA every product runs as CUDA_ROWS-row parts: a tree of one more row takes two.
ROWS = (2, 3, 4, 5, 6, 7, 8, 9, 13, 40)


def tree_parents(n: int) -> list[int]:
    """An n-node tree: a chain of about half its nodes (2 to CHAIN), then leaves hung off the
    chain's nodes in turn."""
    chain = min(CHAIN, max(2, (n + 1) // 2))
    return [-1, *range(chain - 1), *(i % (chain - 1) for i in range(n - chain))]


def row_mismatch(net) -> str | None:
    """Which row of which tree differs from its token run alone, or None when none does."""
    device = net.device
    sizes = ROWS if device.type == "cpu" else (*ROWS, CUDA_ROWS + 1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, net.config.vocab_size, (PROMPT + CHAIN,), generator=g).to(device)
    cache = StaticCache(net.config, CONTEXT + max(sizes), net.dtype, device)
    prefill(net, ids[:PROMPT], cache, 0)
    while cache.length < CONTEXT:
        n = min(cache.length, CONTEXT - cache.length)
        copy_slots(cache, cache.length, cache, 0, n)
        cache.commit(n)
    chain = ids[PROMPT:]
    alone = []
    for depth in range(CHAIN):          # the chain, a token at a time
        position = torch.tensor([CONTEXT + depth], device=device)
        alone.append(net(chain[depth:depth + 1], position, cache).logits[0])
        cache.commit(1)
    cache.rollback(CONTEXT)
    alone = torch.stack(alone)          # [CHAIN, vocab]: each depth's logits
    for n in sizes:
        shape = TreeShape(tree_parents(n), device)
        rows = net(chain[shape.depth], shape.depth + CONTEXT, cache,
                   shape.mask(net.dtype)).logits
        differs = (rows != alone[shape.depth]).any(-1).nonzero().flatten().tolist()
        if differs:
            return f"row {differs[0]} of a {n}-row draft tree"
    return None


def _cpu_name() -> str:
    """The CPU's model name and a digest of its flags (Linux), else the platform's word."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform
        return platform.processor() or platform.machine()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1] for ln in lines if ln.startswith("flags")), "")
    return f"{model} {hashlib.sha256(flags.encode()).hexdigest()[:12]}"


def _host(device: torch.device) -> str:
    """The processor the products run on: the CPU's name, or the GPU's and its capability."""
    if device.type == "cpu":
        return _cpu_name()
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"


def shape_key(net, profile: KernelProfile) -> str:
    """A digest of the host, the kernel profile and the model's shapes."""
    c = net.config
    products = [(type(p).__name__, [tuple(t.shape) for t in (*p.parameters(), *p.buffers())])
                for p in (*net.layers[0].children(), net.lm_head)]
    key = {"host": _host(net.device), "profile": profile.as_dict(), "products": products,
           "shape": [c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size,
                     c.rope.type, c.tie_word_embeddings]}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


class _Answers:
    """Answers kept in longspec_home()/row-checks.json: {key: null or the mismatch}."""

    def __init__(self) -> None:
        self.path = longspec_home() / "row-checks.json"
        try:
            self.known = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}

    def mismatch(self, net) -> str | None:
        key = shape_key(net, kernel_profile(net))
        if key not in self.known:
            self.known[key] = row_mismatch(net)
            try:
                write_json(self.path, self.known)
            except OSError:
                pass        # a read-only home: the check runs again at the next load
        return self.known[key]


def _paths(net) -> Iterator[str]:
    """Puts `net` on each path the row check may take, fastest first, and names it: the
    compiled layers, the Python ones (on longspec::attention where it runs), the Python ones
    with attention as products."""
    if net.native is not None:
        yield "compiled layers"
        net.native = None
    if net.attention == "loops":
        yield "Python layers"
    elif net.attention == "triton":
        yield "Python layers with attention in one Triton kernel"
    net.attention = "products"
    yield "Python layers with attention as products"


def checked_profile(net) -> KernelProfile:
    """The network's kernel profile on the first path that passes the row check (with one
    warning where that is not its first), or on its first path without speculation (with one
    warning) where none does."""
    answers = _Answers()
    first = net.native, net.attention
    failed = []
    for path in _paths(net):
        problem = answers.mismatch(net)
        if problem is None:
            break
        failed.append(f"{path} failed ({problem})")
    else:
        net.native, net.attention = first
        where = "CPU" if net.device.type == "cpu" else "GPU"
        why = "; ".join(failed)
        warnings.warn(f"longspec: on this {where} a draft tree's rows differ from their tokens "
                      f"run alone ({why}): decoding without speculation, every method as plain "
                      f"decoding (ar); please report the {where} and torch version",
                      stacklevel=3)
        return kernel_profile(net, why, speculation=f"off ({why}): every method decodes as ar")
    if failed:
        why = "; ".join(failed)
        warnings.warn(f"longspec: on this CPU the {why}: running the {path} instead (slower, "
                      "exact)", stacklevel=3)
        return kernel_profile(net, f"{why}: {path}")
    return kernel_profile(net, "passed")

"""The row check at load: on this host, at the model's shapes, is every row of a draft tree
bitwise what its token gets run alone after its ancestors?

Exactness rests on that (attention.py, linear.py), and the kernels' row rules were measured on
particular CPUs and torch versions. So a model checks it once per host (the CPU, or the
GPU), kernel profile (torch, longspec and the digest of the code that decides bits:
profile.py) and model shape (the answer is kept in longspec's cache directory): a 40-row tree
(past the products' 32-row split) over a short prompt through the real products and attention,
its chain and three leaves run alone. Where the compiled layers fail it,
the Python layers are checked and taken; where those fail too, the profile says so and a warning
tells the user that speculation may write other tokens than plain decoding here.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import torch

from ..cache.full import StaticCache
from ..tree import TreeShape
from .prefill import prefill
from .profile import KernelProfile, kernel_profile
from .sources import longspec_home

CONTEXT = 24                 # prompt tokens before the tree
CHAIN = 8                    # the tree: a chain of 8 nodes, then 32 leaves hung off it in turn
PARENTS = [-1, *range(CHAIN - 1), *(j % CHAIN for j in range(32))]
LEAVES = (CHAIN, CHAIN + 13, len(PARENTS) - 1)     # leaves run alone too


def row_mismatch(net) -> str | None:
    """Which row of the tree differs from its token run alone, or None when none does."""
    device = net.device
    shape = TreeShape(PARENTS, device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, net.config.vocab_size, (CONTEXT + shape.n,), generator=g).to(device)
    cache = StaticCache(net.config, CONTEXT + shape.n + 1, net.dtype, device)
    prefill(net, ids[:CONTEXT], cache, 0)
    tree = ids[CONTEXT:]
    rows = net(tree, shape.depth + CONTEXT, cache, shape.mask(net.dtype)).logits

    def alone(node: int) -> str | None:
        position = torch.tensor([CONTEXT + shape.depths[node]], device=device)
        logits = net(tree[node:node + 1], position, cache).logits[0]
        return None if torch.equal(logits, rows[node]) else (
            f"row {node} of a {shape.n}-row draft tree")

    for node in range(CHAIN):          # the chain, a token at a time
        if (problem := alone(node)) is not None:
            return problem
        cache.commit(1)
    for leaf in sorted(LEAVES, key=lambda j: -PARENTS[j]):   # cut back to each leaf's parent
        cache.rollback(CONTEXT + PARENTS[leaf] + 1)
        if (problem := alone(leaf)) is not None:
            return problem
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


def _shape_key(net, profile: KernelProfile) -> str:
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
        key = _shape_key(net, kernel_profile(net))
        if key not in self.known:
            self.known[key] = row_mismatch(net)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(self.known))
                os.replace(tmp, self.path)
            except OSError:
                pass        # a read-only home: the check runs again at the next load
        return self.known[key]


def checked_profile(net) -> KernelProfile:
    """The network's kernel profile after the row check, which may move a CPU model from the
    compiled layers to the Python ones (with one warning)."""
    where = "CPU" if net.device.type == "cpu" else "GPU"
    answers = _Answers()
    problem = answers.mismatch(net)
    if problem is not None and net.native is not None:
        compiled_problem, net.native = problem, None
        problem = answers.mismatch(net)
        if problem is None:
            warnings.warn(f"longspec: on this CPU the compiled layers' {compiled_problem} differs "
                          "from its token run alone; running the Python layers instead (slower, "
                          "exact)", stacklevel=3)
            return kernel_profile(net, f"compiled layers failed ({compiled_problem}): python "
                                       "layers")
    if problem is not None:
        warnings.warn(f"longspec: on this {where} the {problem} differs from its token run "
                      "alone: speculative methods may write other tokens than plain decoding "
                      f"(ar) here; please report the {where} and torch version", stacklevel=3)
        return kernel_profile(net, f"failed ({problem})")
    return kernel_profile(net, "passed")

"""The target's step over a draft tree at static shapes, captured once per row bucket as a CUDA
graph (gpt-fast's and vLLM's way past the cost of launching a forward's ~1,300 kernels one by
one from Python).

A tree of n nodes runs in the smallest bucket of BUCKETS rows that holds it: its tokens, then
rows that only pad (each sees the committed cache and itself; their keys land in slots past
the tree, never committed, and their logits are dropped). Everything a step changes lives in
static device buffers written before the replay: the tokens (copied on the device), and in one
upload from the host, the positions, each row's tail layout (tree_attention.py: its
ancestors' block slots in depth order, and how many it sees) and the committed length, which
the cache write and the attention kernel read from the device. So one graph per bucket serves
every context length, and a replay issues the same kernels as the eager forward: a row's bits
are the same with graphs or without, and the same in every bucket (the products run as
CUDA_ROWS-row parts on CUDA, the kernel is row by row).

Without CUDA (a CPU, under Triton's interpreter, in the tests) the same static forward runs
eagerly, so the buffers and the bucket rule are checked against `ar` there too.
"""

from __future__ import annotations

import os

import torch

from ..cache.base import AttentionPlan
from ..cache.full import StaticCache
from ..memory import upload
from .transformer import ForwardOutput

BUCKETS = (1, 16, 64)


def bucket_rows(n: int) -> int | None:
    """The rows of the bucket a tree of n nodes runs in; None past the largest."""
    return next((b for b in BUCKETS if b >= n), None)


def graphs_wanted(net) -> bool:
    """Whether the target's tree steps run as static buckets (captured on CUDA): attention in
    the Triton kernel, unless LONGSPEC_GRAPHS=0 turns them off."""
    return net.attention == "triton" and os.environ.get("LONGSPEC_GRAPHS", "1") != "0"


class StaticSteps:
    """The tree steps of one generation over its cache: `__call__(tree)` -> ForwardOutput with
    logits [n, vocab] and hidden states [n, hidden]."""

    def __init__(self, net, cache: StaticCache):
        self.net = net
        self.cache = cache
        self.capture = net.device.type == "cuda"
        self.buckets: dict[int, _Bucket] = {}

    @staticmethod
    def rows_needed(max_nodes: int) -> int:
        """Cache slots past the committed ones a step may write (its bucket's rows)."""
        return bucket_rows(max_nodes) or max_nodes

    def bucket(self, n: int) -> _Bucket | None:
        """The bucket of a tree of n nodes, made (and captured) on first use; None past the
        largest (the eager forward)."""
        size = bucket_rows(n)
        if size is not None and size not in self.buckets:
            self.buckets[size] = _Bucket(self.net, self.cache, size, self.capture)
        return None if size is None else self.buckets[size]

    def __call__(self, tree) -> ForwardOutput:
        bucket = self.bucket(tree.n)
        if bucket is None:
            shape = tree.shape
            return self.net(tree.tokens, shape.depth + self.cache.length, self.cache,
                            shape.mask(self.net.dtype), return_hidden=True)
        return bucket.run(tree)


def _fields(packed: torch.Tensor, rows: int) -> tuple[torch.Tensor, ...]:
    """The views of a bucket's packed step inputs: positions [rows], tail [rows, rows],
    count [rows], the committed length [1]."""
    return (packed[:rows], packed[rows:rows * (rows + 1)].view(rows, rows),
            packed[rows * (rows + 1):rows * (rows + 2)], packed[-1:])


class _Bucket:
    """Static buffers of one bucket of rows, and its graph once captured."""

    def __init__(self, net, cache: StaticCache, rows: int, capture: bool):
        self.net, self.cache, self.rows = net, cache, rows
        device = net.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        # the step's inputs from the host, one upload a step (_fields)
        self.packed = torch.zeros(rows * (rows + 2) + 1, dtype=torch.long, device=device)
        self.positions, tail, count, start = _fields(self.packed, rows)
        self.plan = AttentionPlan(start, rows, cache.k[0].shape[1], None, layout=(tail, count))
        self.graph = None
        self.out: ForwardOutput | None = None
        if capture:
            self._capture()

    def _forward(self) -> ForwardOutput:
        return self.net(self.tokens, self.positions, self.cache, plan=self.plan,
                        return_hidden=True)

    def _capture(self) -> None:
        """Warm up on a side stream, then capture, with the cache's committed length in the
        buffers: the warm-up and the capture write keys only past the committed slots."""
        self.packed.copy_(self._layout(None))
        stream = torch.cuda.Stream(self.net.device)
        stream.wait_stream(torch.cuda.current_stream(self.net.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream(self.net.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._forward()

    def _layout(self, shape) -> torch.Tensor:
        """The host's packed positions, tails, counts and committed length for a tree of this
        shape (None: no tree, every row padding) on the device."""
        rows, start = self.rows, self.cache.length
        n = 0 if shape is None else shape.n
        host = torch.zeros_like(self.packed, device="cpu")
        positions, tail, count, length = _fields(host, rows)
        positions.fill_(start)
        count.fill_(1)
        tail[:, 0] = torch.arange(rows)                 # a padding row sees itself
        if n:
            depth = torch.tensor(shape.depths)
            positions[:n] += depth
            count[:n] = depth + 1
            tail[:n, :shape.max_depth + 1] = shape.host_paths.clamp(min=0)
        length.fill_(start)
        return upload(host, self.net.device)

    def run(self, tree) -> ForwardOutput:
        n = tree.n
        self.tokens[:n].copy_(tree.tokens)
        self.packed.copy_(self._layout(tree.shape))
        if self.graph is None:
            out = self._forward()
            return ForwardOutput(out.logits[:n], out.hidden[:n])
        self.graph.replay()
        # copies: the graph's outputs are overwritten by its next replay
        return ForwardOutput(self.out.logits[:n].clone(), self.out.hidden[:n].clone())

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

Several generations stepping together (engine/batching.py) run the same way (BatchSteps): each
member's tree in its own bucket's buffers, the buckets' rows one after another in one forward
over the members' caches (Transformer.forward_many with the buckets' plans), captured per
combination of buckets that recurs (a batch's plain steps: every member's bucket of one row).
Its rows are each member's bucket's rows alone, bit for bit, as forward_many's are.

A bucket, or a batch's combination of buckets, is captured where its recurring pays for the
capture (Captures), not at its first run: a capture takes the seconds of several eager runs,
and many never run again (a drafting try's tree, a sure draft among a batch's plain steps, the
memberships of a batch whose members leave one by one).

Without CUDA (a CPU, under Triton's interpreter, in the tests) the same static forward runs
eagerly, so the buffers and the bucket rule are checked against `ar` there too.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ..cache.base import AttentionPlan
from ..cache.full import StaticCache
from ..device.memory import upload
from ..state.captures import Captures, EagerRuns
from ..step.forward import ForwardOutput, TopTokens
from .transformer import Segment

BUCKETS = (1, 16, 64)
# captured combinations of members' buckets a batch keeps (the least recently run dropped):
# one per membership of its plain steps, and those of the steps some members draft in
BATCH_GRAPHS = 8


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

    def __init__(self, net, cache: StaticCache, captures: Captures):
        self.net = net
        self.cache = cache
        self.captures = captures if net.device.type == "cuda" else None
        self.buckets: dict[int, _Bucket] = {}

    @staticmethod
    def rows_needed(max_nodes: int) -> int:
        """Cache slots past the committed ones a step may write (its bucket's rows)."""
        return bucket_rows(max_nodes) or max_nodes

    def bucket(self, n: int) -> _Bucket | None:
        """The bucket of a tree of n nodes, made on first use; None past the largest (the
        eager forward)."""
        size = bucket_rows(n)
        if size is None:
            return None
        bucket = self.buckets.get(size)
        if bucket is None:
            bucket = self.buckets[size] = _Bucket(self.net, self.cache, size)
        return bucket

    def capture(self, n: int) -> None:
        """Capture the bucket of a tree of n nodes now, where steps are captured (before a
        step that times a size: a capture is not a step's cost, and the size is timed as it
        runs once it recurs)."""
        bucket = self.bucket(n)
        if bucket is not None and self.captures is not None and bucket.graph is None:
            bucket.graph, bucket.out = self.captures.capture(self.net, [bucket], bucket.forward,
                                                             bucket.eager)

    def __call__(self, tree, left: int) -> ForwardOutput:
        """`left`: the tokens the generation has left to generate."""
        bucket = self.bucket(tree.n)
        if bucket is None:
            shape = tree.shape
            return self.net(tree.tokens, shape.depth + self.cache.length, self.cache,
                            shape.mask(self.net.dtype), return_hidden=True)
        recurs = left if tree.n == 1 else None
        if self.captures is not None and self.captures.due(bucket.eager, recurs):
            self.capture(tree.n)
        return bucket.run(tree)


def _fields(packed: torch.Tensor, rows: int) -> tuple[torch.Tensor, ...]:
    """The views of a bucket's packed step inputs: positions [rows], tail [rows, rows],
    count [rows], the committed length [1]."""
    return (packed[:rows], packed[rows:rows * (rows + 1)].view(rows, rows),
            packed[rows * (rows + 1):rows * (rows + 2)], packed[-1:])


class _Bucket:
    """Static buffers of one bucket of rows, and its graph once captured."""

    def __init__(self, net, cache: StaticCache, rows: int):
        self.net, self.cache, self.rows = net, cache, rows
        device = net.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        # the step's inputs from the host, one upload a step (_fields)
        self.packed = torch.zeros(rows * (rows + 2) + 1, dtype=torch.long, device=device)
        self.positions, tail, count, start = _fields(self.packed, rows)
        self.plan = AttentionPlan(start, rows, cache.k[0].shape[1], None, layout=(tail, count))
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: ForwardOutput | None = None
        self.eager = EagerRuns()       # its eager runs for this generation's steps alone

    def forward(self) -> ForwardOutput:
        return self.net(self.tokens, self.positions, self.cache, plan=self.plan,
                        return_hidden=True)

    def segment(self) -> Segment:
        """The bucket's rows as their part of a forward of several generations."""
        return Segment(self.tokens, self.positions, self.cache)

    def layout(self, shape) -> torch.Tensor:
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

    def load(self, tree) -> None:
        """The tree's tokens and layout into the buffers."""
        self.tokens[:tree.n].copy_(tree.tokens)
        self.packed.copy_(self.layout(tree.shape))

    def run(self, tree) -> ForwardOutput:
        n = tree.n
        self.load(tree)
        if self.graph is None:
            out = self.eager.timed(self.forward)
            return ForwardOutput(out.logits[:n], out.hidden[:n])
        self.graph.replay()
        # copies: the graph's outputs are overwritten by its next replay
        return ForwardOutput(self.out.logits[:n].clone(), self.out.hidden[:n].clone())


class BatchSteps:
    """The tree steps of a batch's members over their caches at static shapes:
    `__call__(steps, trees)` -> each member's ForwardOutput (logits [n, vocab], hidden
    [n, hidden]), or None where a tree is past the largest bucket (the eager forward_many).
    A combination of buckets runs eagerly until Captures says its capture is due."""

    def __init__(self, net, captures: Captures):
        self.net = net
        self.captures = captures if net.device.type == "cuda" else None
        # by the buckets' identities, the least recently run first
        self.graphs: OrderedDict[tuple[int, ...], _Combination] = OrderedDict()

    def __call__(self, steps: list[StaticSteps], trees: list, left: list[int]
                 ) -> list[ForwardOutput] | None:
        """`left`: the tokens each member has left to generate."""
        buckets = [s.bucket(t.n) for s, t in zip(steps, trees)]
        if None in buckets:
            return None
        plain = all(t.n == 1 for t in trees)
        combination = self._combination(buckets, min(left) if plain else None)
        for b, tree in zip(buckets, trees):
            b.load(tree)
        if combination.graph is None:
            logits, hidden = combination.eager.timed(lambda: self._forward(buckets))
        else:
            graph, (logits, hidden) = combination.graph
            graph.replay()
            # copies: the graph's outputs are overwritten by its next replay
            logits, hidden = logits.clone(), hidden.clone()
        top, outs, row = TopTokens(logits), [], 0
        for b, tree in zip(buckets, trees):
            rows = slice(row, row + tree.n)
            outs.append(ForwardOutput(logits[rows], hidden[rows], shared_top=top, rows=rows))
            row += b.rows
        return outs

    def forget(self, steps: StaticSteps) -> None:
        """Drop the graphs over a member's buckets (it left: they would not run again)."""
        gone = {id(b) for b in steps.buckets.values()}
        for key in [key for key in self.graphs if gone.intersection(key)]:
            del self.graphs[key]

    def _combination(self, buckets: list[_Bucket], recurs: int | None) -> _Combination:
        """The buckets' combination, captured here once its capture is due (`recurs`:
        Captures.due's)."""
        key = tuple(map(id, buckets))
        combination = self.graphs.get(key)
        if combination is None:
            combination = self.graphs[key] = _Combination(buckets)
            while len(self.graphs) > BATCH_GRAPHS:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        if (combination.graph is None and self.captures is not None
                and self.captures.due(combination.eager, recurs)):
            combination.graph = self.captures.capture(
                self.net, buckets, lambda: self._forward(buckets), combination.eager)
        return combination

    def _forward(self, buckets: list[_Bucket]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and hidden states of every bucket's rows, one bucket after another."""
        outs = self.net.forward_many([b.segment() for b in buckets], return_hidden=True,
                                     plans=[b.plan for b in buckets])
        return outs[0].shared_top.logits, torch.cat([o.hidden for o in outs])


@dataclass
class _Combination:
    """A batch's combination of buckets (kept alive while its graph is), its eager runs, and
    once captured its graph and what the graph returns."""
    buckets: list[_Bucket]
    eager: EagerRuns = field(default_factory=EagerRuns)
    graph: tuple | None = None

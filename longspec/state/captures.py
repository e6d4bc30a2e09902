"""When the target's static steps are captured as CUDA graphs (models/graphs.py), and the
captured steps kept for the generations that follow: state the generations on a model share
(state/shared.py), so it sits beside it, below the models that read it.

A capture costs the seconds of several eager runs of the step (two warm-up forwards, the
capture, the graph's instantiation), which only its replays pay back: Captures decides, from
how often a step may recur, when that is. A generation's graphs are captured over its own KV
cache, so a later generation could replay them only over the same cache: a finished
generation's cache is kept with its steps (state/kept_caches.py), and a generation whose cache
fits in a kept one takes it, graphs and all.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch


class Captures:
    """When a static step is captured, as measured on one model (its SharedState holds this).

    Capturing a step costs seconds (two warm-up forwards, the capture, the graph's
    instantiation) that only its later replays pay back, and many steps never recur: a
    drafting try's tree, a sure draft among a batch's plain steps, each membership of a batch
    whose members leave one by one. So a step's first run is eager, and it is captured when its
    recurring will pay for the capture: a plain step (every tree the root alone) recurs at most
    as many times as its generations have tokens left (the fewest of them, in a batch), and is
    captured where that many eager runs would cost more than the capture; any other step is
    captured once its eager runs have cost what its capture would (the ski-rental rule: never
    more than twice the seconds of the choice made knowing how often it recurs). A capture's
    cost is `runs` eager runs of the same step (its seconds over the fastest eager run of what
    it captured), measured at every capture; before the first, 1. Without CUDA nothing is
    captured."""

    def __init__(self):
        self.runs = 1.0
        self.taken = 0          # captures so far, and their seconds (for benchmarks)
        self.spent_s = 0.0

    def due(self, ran: EagerRuns, recurs: int | None) -> bool:
        """Whether to capture a step that has run eagerly as `ran` says and may recur at most
        `recurs` more times (None: not known)."""
        if not ran.runs:
            return False
        return (ran.runs if recurs is None else recurs) >= self.runs

    def capture(self, net, buckets: list, forward, ran: EagerRuns
                ) -> tuple[torch.cuda.CUDAGraph, object]:
        """`_capture(net, buckets, forward)`, its seconds measured against `ran`'s eager run."""
        torch.cuda.synchronize(net.device)
        begin = time.perf_counter()
        captured = _capture(net, buckets, forward)
        torch.cuda.synchronize(net.device)
        seconds = time.perf_counter() - begin
        self.taken += 1
        self.spent_s += seconds
        self.measured(seconds, ran)
        return captured

    def measured(self, seconds: float, ran: EagerRuns) -> None:
        """A capture took `seconds`; `ran`: the eager runs of what it captured (none: nothing
        to weigh it against, so nothing learned)."""
        if ran.runs:
            self.runs = seconds / ran.fastest_s


@dataclass
class EagerRuns:
    """A step's eager runs so far, while it is not captured (Captures)."""
    runs: int = 0
    fastest_s: float = float("inf")     # the host's seconds of the fastest (launching it)

    def timed(self, forward):
        """`forward()`, counted and timed."""
        begin = time.perf_counter()
        out = forward()
        self.runs += 1
        self.fastest_s = min(self.fastest_s, time.perf_counter() - begin)
        return out


def _capture(net, buckets: list, forward) -> tuple[torch.cuda.CUDAGraph, object]:
    """`forward()` over the buckets' buffers (graphs.py's) captured, and what it returned:
    warmed up on a side stream first, every bucket's rows padding at its cache's committed
    length, so the warm-up and the capture write keys only past the committed slots. Python's
    garbage collector is held during the capture: a collection there can free an ended
    generation's graph, which CUDA forbids while capturing (on an H200, two streams interleaved
    on one model after other generations failed so)."""
    for b in buckets:
        b.packed.copy_(b.layout(None))
    stream = torch.cuda.Stream(net.device)
    stream.wait_stream(torch.cuda.current_stream(net.device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            forward()
    torch.cuda.current_stream(net.device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph):
            out = forward()
    finally:
        if collecting:
            gc.enable()
    return graph, out

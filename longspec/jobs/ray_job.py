"""`longspec batch --ray ADDRESS`: a batch job's lines spread over Ray actors, one loaded model
each, on one machine or a cluster (`pip install -e ".[ray]"`). The driver keeps `max_batch`
lines under way on each actor, which steps them together as the server does (serve/worker.py:
one thread runs its batch; a line joins as another ends), and writes the results as batch_job.py
does: in input order, each line once and whole, the same line a run without Ray writes where
the actor's CPU has the driver's kernel profile (a line's tokens are those of the machine that
ran it).

A killed job run again keeps its finished lines and starts the others from their beginning:
the lines under way on the actors are not checkpointed (run without --ray for that).
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch

from ..engine.batching import DEFAULT_MAX_BATCH
from .batch_job import Line, append_line, line_sidecar, pending, result_line

LOCAL = "local"     # --ray local: start a Ray instance on this machine for the job


class BatchActor:
    """One loaded model (and draft model) generating the lines it is handed, up to `max_batch`
    at once (an async Ray actor: each line waits on the asyncio side while the worker thread
    steps the batch)."""

    def __init__(self, model_args: dict, draft_args: dict | None, threads: int,
                 max_batch: int):
        from ..models import load_model
        from ..serve.worker import Worker, on_own_thread

        torch.set_num_threads(threads)
        self.model, self.draft = on_own_thread(lambda: (
            load_model(**model_args), None if draft_args is None else load_model(**draft_args)))
        self.worker = Worker(max_batch, on_result=lambda _: None, max_batch=max_batch)

    async def run(self, line: Line) -> dict:
        from ..api import stream_request
        from ..serve.worker import Finished, Job

        r = line.request if self.draft is None else replace(line.request, draft_model=self.draft)
        s = await asyncio.wrap_future(self.worker.call(lambda: stream_request(self.model, r)))
        job = Job(s, math.inf, asyncio.get_running_loop())
        self.worker.submit(job)
        event = None
        while not isinstance(event, Finished):
            event = await job.events.get()
        if event.error is not None:
            raise RuntimeError(f"line {line.id}: {event.error}")
        return result_line(line, event.result, self.model)


def run_job_ray(address: str, actors: int, model_args: dict, draft_args: dict | None,
                  lines: list[Line], out: str | Path, progress: bool = True,
                  max_batch: int = DEFAULT_MAX_BATCH) -> Iterator[dict]:
    """Generate each line not yet in `out` on `actors` Ray actors (of the cluster at `address`,
    or LOCAL), `max_batch` at a time on each, appending the results to `out` in input order;
    yields them as written."""
    import ray

    out = Path(out)
    todo = pending(lines, out)
    if not todo:
        return
    started = not ray.is_initialized()
    if started:
        ray.init(address=None if address == LOCAL else address, log_to_driver=False,
                 include_dashboard=False)
    try:
        cpus = max(1, int(ray.available_resources().get("CPU", 1)) // actors)
        actor = ray.remote(num_cpus=cpus)(BatchActor)
        workers = [actor.remote(model_args, draft_args, cpus, max_batch) for _ in range(actors)]
        running = {}                          # object ref -> (worker, index in todo)
        ready: dict[int, dict] = {}
        queue = iter(range(len(todo)))
        written = 0
        for _ in range(max_batch):
            for worker in workers:
                index = next(queue, None)
                if index is not None:
                    running[worker.run.remote(todo[index])] = (worker, index)
        while running:
            (ref,), _ = ray.wait(list(running), num_returns=1)
            worker, index = running.pop(ref)
            ready[index] = ray.get(ref)
            following = next(queue, None)
            if following is not None:
                running[worker.run.remote(todo[following])] = (worker, following)
            while written in ready:            # in input order, as they complete
                result = ready.pop(written)
                append_line(out, result)
                written += 1
                if progress:
                    done = len(lines) - len(todo) + written
                    print(f"longspec batch: line {done} of {len(lines)} done (id "
                          f"{result['id']}, {len(result['token_ids'])} tokens)", file=sys.stderr)
                yield result
        for number in range(1, len(lines) + 1):    # those of a run without Ray, now finished
            line_sidecar(out, number).unlink(missing_ok=True)
    finally:
        if started:
            ray.shutdown()

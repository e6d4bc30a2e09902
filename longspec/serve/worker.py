"""The generations of the server: one worker thread steps up to `max_batch` of them together
(engine/batching.py: one forward verifies every member's tree), and the asyncio side only waits for
what they commit.

Queued jobs join the batch, in arrival order, at a step boundary while it has room; a joining
job's prompt runs a prefill chunk before each of the batch's steps (Batch.admit), so the
running streams wait at most one chunk for an arrival. Each job leaves when its generation
ends, and a failure in one generation ends that one alone. The queue is bounded (a full one is
refused at once, never waited on). A job carries a deadline and a cancel flag; the worker looks
at both after every step, so a client that leaves or runs out of time stops its generation
within one step and a waiting job takes its place. A step itself (and a prefill chunk) is not
interrupted.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from ..api import GenerationResult, Stream
from ..engine.batching import Batch

log = logging.getLogger("longspec.serve")
T = TypeVar("T")


@dataclass(frozen=True)
class Finished:
    """The last event of a job."""

    result: GenerationResult | None   # None: cancelled (or the server stopped) before it ran
    timed_out: bool = False
    error: str | None = None          # an unexpected failure of the generation


class QueueFull(Exception):
    pass


def on_own_thread(function: Callable[[], T]) -> T:
    """`function()` run on a thread that then ends, its OpenMP threads with it: loading a model
    there leaves a Worker's thread the only one that runs it (see Worker)."""
    with ThreadPoolExecutor(1, thread_name_prefix="longspec-load") as pool:
        return pool.submit(function).result()


class Job:
    """A prepared generation and the channel its chunks go back through."""

    def __init__(self, stream: Stream, deadline: float, loop: asyncio.AbstractEventLoop):
        self.stream = stream
        self.deadline = deadline          # time.monotonic() after which the job is stopped
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()   # Chunk..., then one Finished
        self.started = False              # the worker has taken it (set on the worker thread)
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def emit(self, item) -> None:
        """Hand an event to the asyncio side (called on the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:
            pass    # the event loop is closed: the server is shutting down


class Worker:
    """The thread that runs every generation of the server, and every other piece of work
    that runs the model (`call`): a process's CPU kernels run several times slower on a thread
    when another thread has a team of OpenMP threads too (SmolLM2: 16 ms a step against 3.9),
    so one thread does all of it."""

    def __init__(self, max_queue: int, on_result: Callable[[GenerationResult], None],
                 max_batch: int = 1):
        if max_queue < 1:
            raise ValueError(f"the queue must hold at least 1 request, got {max_queue}")
        if max_batch < 1:
            raise ValueError(f"a batch must hold at least 1 generation, got {max_batch}")
        self.queue: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self.on_result = on_result
        self.max_batch = max_batch
        self.running: list[Job] = []     # the jobs in the batch (read by other threads)
        self.mean_job_s = 1.0            # moving average of a job's run time (for Retry-After)
        self._began: dict[int, float] = {}       # by id(job): when it joined
        self._calls: queue.SimpleQueue = queue.SimpleQueue()    # (function, Future)
        self._wake = threading.Event()
        self._submitting = threading.Lock()
        self._stopping = False
        self._busy_since: float | None = None    # time.monotonic() its current work began
        self.thread = threading.Thread(target=self._loop, name="longspec-generate", daemon=True)
        self.thread.start()

    def waiting(self) -> int:
        return self.queue.qsize()

    def room(self) -> int:
        """Jobs the queue takes now."""
        return self.queue.maxsize - self.queue.qsize()

    def submit(self, job: Job) -> None:
        self.submit_all([job])

    def submit_all(self, jobs: list[Job]) -> None:
        """Queue the jobs (a request's choices), all or none: QueueFull when they do not all
        fit."""
        with self._submitting:
            if self.room() < len(jobs):
                raise QueueFull
            for job in jobs:
                self.queue.put_nowait(job)
        self._wake.set()

    def call(self, function: Callable[[], T]) -> Future[T]:
        """Run `function` on the worker thread, at the next step boundary."""
        future: Future[T] = Future()
        self._calls.put((function, future))
        self._wake.set()
        return future

    def retry_after_s(self) -> int:
        """A guess of when a slot frees up: the queue drains max_batch mean jobs at a time."""
        rounds = 1 + self.waiting() // self.max_batch
        return max(1, min(600, round(self.mean_job_s * rounds)))

    def stop(self) -> None:
        """Stop the running jobs, drop the queued ones, end the thread."""
        self._stopping = True
        for job in list(self.running):
            job.cancel()
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            job.cancel()
            job.stream.close()
            job.emit(Finished(None))
        self._wake.set()
        self.thread.join(timeout=30)

    # -- the worker thread ----------------------------------------------------------------------

    def busy_s(self) -> float:
        """Seconds the worker has spent on its current piece of work (a step, an admission,
        a call); 0 while it waits for one."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def _loop(self) -> None:
        batch: Batch | None = None
        try:
            while not self._stopping or self.running:
                try:
                    batch = self._round(batch)
                except Exception as e:      # the worker must outlive it
                    log.exception("the worker's step failed; its generations end")
                    self._fail_all(batch, f"{type(e).__name__}: {e}")
                    batch = None
                finally:
                    self._busy_since = None
                if not self.running and not self._stopping:
                    self._wake.wait()       # nothing to step: until a job or a call comes
                    self._wake.clear()
        finally:
            if batch is not None:
                batch.close()
            while not self._calls.empty():
                _, future = self._calls.get()
                future.set_exception(RuntimeError("the server is shutting down"))

    def _round(self, batch: Batch | None) -> Batch | None:
        """The calls waiting, the jobs that fit, then one step of the batch; the batch."""
        self._busy_since = time.monotonic()
        self._run_calls()
        while len(self.running) < self.max_batch and not self._stopping:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if batch is None:
                batch = Batch(job.stream.model)
            self._admit(batch, job)
        if self.running:
            self._step(batch)
        return batch

    def _fail_all(self, batch: Batch | None, error: str) -> None:
        """End every running job with `error` and close the batch (the caller drops it; the
        next job makes a new one): what is left after a failure outside any one generation."""
        if batch is not None:
            batch.close()
        for job in list(self.running):
            self.running.remove(job)
            self._end(job, error=error)

    def _run_calls(self) -> None:
        while not self._calls.empty():
            function, future = self._calls.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except Exception as e:  # noqa: BLE001 (handed to the caller)
                    future.set_exception(e)

    def _admit(self, batch: Batch, job: Job) -> None:
        """Start a job's generation in the batch, or end it at once (cancelled or expired
        while it waited, or with nothing left to generate)."""
        job.started = True
        if job.cancelled or job.expired():
            job.stream.close()
            job.emit(Finished(job.stream.result if not job.cancelled else None,
                              timed_out=not job.cancelled))
            return
        self._began[id(job)] = time.monotonic()
        batch.admit(job.stream)         # its prefill runs a chunk a step (Batch.step)
        if job.stream.result is not None:       # it had nothing left to generate
            self._end(job)
        else:
            self.running.append(job)

    def _step(self, batch: Batch) -> None:
        """One step of the batch; each job's chunk goes out, a failed or finished job ends
        (a failure ends its own generation alone: Batch.step), then a cancelled or expired one
        leaves."""
        by_stream = {id(job.stream): job for job in self.running}
        for stream, item in batch.step():
            job = by_stream[id(stream)]
            if isinstance(item, Exception):
                log.error("generation failed", exc_info=item)
                self.running.remove(job)
                self._end(job, error=f"{type(item).__name__}: {item}")
                continue
            job.emit(item)
            if stream.result is not None:       # its generation ended: it left the batch
                self.running.remove(job)
                self._end(job)
        for job in list(self.running):
            if job.cancelled or job.expired():
                self.running.remove(job)
                try:
                    batch.leave(job.stream, False)
                except Exception as e:  # its finish failed: it ends with that
                    log.exception("generation failed")
                    self._end(job, error=f"{type(e).__name__}: {e}")
                    continue
                self._end(job, timed_out=not job.cancelled)

    def _end(self, job: Job, timed_out: bool = False, error: str | None = None) -> None:
        began = self._began.pop(id(job), None)
        if began is not None:
            self.mean_job_s = 0.8 * self.mean_job_s + 0.2 * (time.monotonic() - began)
        result = job.stream.result
        if result is not None and result.stats.get("steps"):
            self.on_result(result)
        job.emit(Finished(result, timed_out, error))

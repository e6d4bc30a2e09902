"""One generation at a time per model: a single worker thread runs queued generations in FIFO
order, and the asyncio side only waits for what they commit.

The queue is bounded (a full one is refused at once, never waited on). A job carries a deadline
and a cancel flag; the worker looks at both after every engine step, so a client that leaves or
runs out of time stops its generation within one step and the next job starts at once. A step
itself (and a prefill) is not interrupted.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..api import GenerationResult, Stream

log = logging.getLogger("longspec.serve")


@dataclass(frozen=True)
class Finished:
    """The last event of a job."""

    result: GenerationResult | None   # None: never started (cancelled or expired in the queue)
    timed_out: bool = False
    error: str | None = None          # an unexpected failure of the generation


class QueueFull(Exception):
    pass


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
    def __init__(self, max_queue: int, on_result: Callable[[GenerationResult], None]):
        if max_queue < 1:
            raise ValueError(f"the queue must hold at least 1 request, got {max_queue}")
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.on_result = on_result
        self.current: Job | None = None
        self.mean_job_s = 1.0            # moving average of a job's run time (for Retry-After)
        self.thread = threading.Thread(target=self._loop, name="longspec-generate", daemon=True)
        self.thread.start()

    def waiting(self) -> int:
        return self.queue.qsize()

    def submit(self, job: Job) -> None:
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    def retry_after_s(self) -> int:
        """A guess of when a slot frees up: the queue drains one mean job at a time."""
        return max(1, min(600, round(self.mean_job_s * (1 + self.waiting()))))

    def stop(self) -> None:
        """Stop the current job, drop the queued ones, end the thread."""
        if self.current is not None:
            self.current.cancel()
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                job.stream.close()
                job.emit(Finished(None))
        self.queue.put(None)
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        while (job := self.queue.get()) is not None:
            self.current = job
            begin = time.monotonic()
            self._run(job)
            self.current = None
            self.mean_job_s = 0.8 * self.mean_job_s + 0.2 * (time.monotonic() - begin)

    def _run(self, job: Job) -> None:
        stream, timed_out, error = job.stream, False, None
        job.started = True
        try:
            if job.expired() and not job.cancelled:
                timed_out = True
            elif not job.cancelled:
                for chunk in stream:
                    job.emit(chunk)
                    if stream.engine.done:
                        continue        # that was the last chunk: let the stream finish
                    if job.cancelled:
                        break
                    if job.expired():
                        timed_out = True
                        break
        except Exception as e:      # a failed generation must not take the worker down
            log.exception("generation failed")
            error = f"{type(e).__name__}: {e}"
        finally:
            stream.close()
            result = stream.result
            if result is not None and result.stats.get("steps"):
                self.on_result(result)
            job.emit(Finished(result, timed_out, error))

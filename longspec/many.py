"""Many prompts on one model: their streams stepped together by a Batch (engine/batching.py), at
most max_batch at a time, a stream joining when another leaves."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from . import api
from .api import Chunk, GenerationResult, Stream
from .engine.batching import DEFAULT_MAX_BATCH, Batch


def run_streams(model, streams: Iterable[Stream], max_batch: int
              ) -> Iterator[tuple[Stream, Chunk]]:
    """Run the streams, at most `max_batch` at a time, in the order given (a stream joins when
    another leaves; the next is made one ahead): each stream's chunks as its steps commit them
    (one empty chunk for a stream with nothing left to generate), its `result` set with its
    last. Closing the iterator stops the members where they are; streams not started are left
    as they are."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    waiting = iter(streams)
    batch = Batch(model)
    try:
        following = next(waiting, None)     # made one ahead: whether any waits (Batch.closed)
        while following is not None or batch.members:
            while following is not None and len(batch) < max_batch:
                stream, following = following, next(waiting, None)
                firsts = batch.join(stream)     # a first step its prefill took
                for chunk in firsts:
                    yield stream, chunk
                if not firsts and stream.result is not None:    # nothing left to generate
                    yield stream, Chunk([], "")
            if batch.members:
                batch.closed = following is None
                for stream, item in batch.step():
                    if isinstance(item, Exception):
                        raise item
                    yield stream, item
    finally:
        batch.close()


def stream_many(model, prompts: Iterable, *, max_batch: int = DEFAULT_MAX_BATCH,
                **settings) -> Iterator[tuple[int, Chunk]]:
    """`stream` for several prompts, batched: (the prompt's index, Chunk) as steps commit
    them, at most `max_batch` generations at a time. The settings are `generate`'s, the same
    for every prompt; each prompt's tokens are those `generate` gives it alone. A prompt's
    generation is set up (and its arguments checked) when the one before it joins the batch,
    and started when it joins."""
    made: dict[int, tuple[int, Stream]] = {}
    for s, chunk in run_streams(model, _streams(model, prompts, settings, made), max_batch):
        yield made[id(s)][0], chunk


def generate_many(model, prompts: Iterable, *, max_batch: int = DEFAULT_MAX_BATCH,
                  **settings) -> list[GenerationResult]:
    """`generate` for several prompts, batched (stream_many): their results, in order."""
    made: dict[int, tuple[int, Stream]] = {}
    for _ in run_streams(model, _streams(model, prompts, settings, made), max_batch):
        pass
    return [s.result for _, s in sorted(made.values(), key=lambda entry: entry[0])]


def _streams(model, prompts: Iterable, settings: dict, made: dict[int, tuple[int, Stream]]
             ) -> Iterator[Stream]:
    """A stream per prompt, made as it is asked for and kept in `made` with its index."""
    for i, prompt in enumerate(prompts):
        s = api.stream(model, prompt, **settings)
        made[id(s)] = (i, s)
        yield s

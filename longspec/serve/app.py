"""The OpenAI-compatible HTTP server: routes, request -> generation settings, and waiting on the
worker (streamed as server-sent events, or whole).

Every check runs before a request is queued: the body against its pydantic model, then the
model name, n and unsupported fields, then longspec's own (prepare: the prompt, the method, the
context, memory), whose ValueError/TypeError become 400s. A queued request therefore always
runs. Timeouts (--request-timeout, counted from the request's arrival, queue included): the
generation stops at the next step; a non-streaming client gets a 504 with an OpenAI-style error
body (not a truncated completion it could mistake for a whole one); a streaming client, whose
200 has gone out with the first chunks, gets an error event and then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from ..api import Chunk, GenerationResult, make_request, open_prepared
from ..models.loader import Model
from ..openai_api.responses import (
    APIError,
    Shape,
    error_body,
    failure_error,
    shutdown_error,
    sse,
    timeout_error,
)
from ..openai_api.schemas import ChatBody, CompletionBody, GenerationBody
from ..openai_api.translate import Defaults, body_settings
from ..request import MAX_SEED, Prepared, prepare_request
from .config import ServeConfig
from .messages import add_messages_routes, anthropic_error, on_messages
from .metrics import PROMETHEUS_TYPE, ApiKeyMiddleware, Metrics, MetricsMiddleware
from .responses_routes import add_responses_routes
from .worker import Finished, Job, QueueFull, Worker

POLL_S = 0.25       # how often a waiting handler looks at its client and its deadline


class Server:
    def __init__(self, model: Model, config: ServeConfig, metrics: Metrics):
        self.model = model
        self.config = config
        self.metrics = metrics
        self.worker = Worker(config.max_queue, on_result=metrics.observe_generation,
                             max_batch=config.max_batch)
        metrics.queue.set_function(self.worker.waiting)
        metrics.watch_prompt_cache(model.state.prompt_cache)

    # -- a request's settings -------------------------------------------------------------------

    def settings(self, body: GenerationBody, chat: bool) -> tuple[object, dict]:
        """The prompt and `stream`'s keyword settings; APIError for what pydantic lets pass."""
        cfg = self.config
        if body.model != cfg.model_name and body.model not in cfg.aliases:
            raise APIError(404, f"the model {body.model!r} does not exist; this server serves "
                           f"{cfg.model_name!r}", param="model", code="model_not_found")
        return body_settings(body, chat, Defaults(cfg.method, cfg.draft_model, cfg.heads,
                                                  tool_format=cfg.tool_format))

    def prepare(self, prompt, settings: dict, seeds: list[int]) -> list[Prepared]:
        """longspec's checks, the prompt tokenized (once), its grammar compiled: each choice's
        request made ready (prepare_request), off the worker's thread, which only builds the
        engines from them (open_prepared)."""
        # max_new_tokens None: the rest of the context, at most default_max_tokens
        request = make_request(prompt, {**settings, "seed": seeds[0]})
        first = prepare_request(self.model, request, None, self.config.default_max_tokens)
        return [first, *(prepare_request(self.model, replace(first.request, seed=seed),
                                         first.prompt_ids) for seed in seeds[1:])]

    # -- one request ----------------------------------------------------------------------------

    async def submit(self, prompt, settings: dict, seeds: list[int], arrived: float
                     ) -> list[Job]:
        """The jobs of a request's choices (one per seed), prepared beside the worker, opened
        on it and queued; APIError for what cannot run (every API's endpoints come here)."""
        if len(seeds) > self.config.max_queue:
            raise APIError(400, f"n={len(seeds)} choices cannot wait in this server's queue of "
                           f"{self.config.max_queue}; ask for fewer", param="n")
        if not self.worker.thread.is_alive():
            raise APIError(503, "the server's generation worker has stopped; restart the server",
                           "server_error", code="worker_stopped")
        if self.worker.room() < len(seeds):     # refuse before building anything (checked again)
            raise self.queue_full()
        try:
            ready = await asyncio.to_thread(self.prepare, prompt, settings, seeds)
            streams = await asyncio.wrap_future(self.worker.call(
                lambda: [open_prepared(self.model, each) for each in ready]))
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e)) from None
        loop = asyncio.get_running_loop()
        jobs = [Job(s, arrived + self.config.request_timeout, loop) for s in streams]
        try:
            self.worker.submit_all(jobs)
        except QueueFull:
            for s in streams:
                s.close()
            raise self.queue_full() from None
        return jobs

    async def generate(self, request: Request, body: GenerationBody, chat: bool) -> Response:
        arrived = time.monotonic()
        prompt, settings = self.settings(body, chat)
        # choice i samples with seed + i (the response names each one's)
        seeds = [(settings["seed"] + i) % (MAX_SEED + 1) for i in range(body.n)]
        jobs = await self.submit(prompt, settings, seeds, arrived)
        shape = Shape(chat, self.config.model_name, seeds, body.return_token_ids,
                      self.model.tokenizer, settings["logprobs"] is not None,
                      tools=jobs[0].stream.tools)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(self.events(jobs, shape, usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        results = await self.results(jobs, request)
        if results is None:
            return Response(status_code=499)     # the client left; nobody reads this
        return JSONResponse(shape.whole(results))

    def queue_full(self) -> APIError:
        return APIError(503, f"the queue is full ({self.config.max_queue} requests wait "
                        "already); retry later", "server_error", code="queue_full",
                        headers={"Retry-After": str(self.worker.retry_after_s())})

    def ended_badly(self, end: Finished) -> APIError | None:
        """What a generation that did not finish tells its client (None: it finished)."""
        if end.error is not None:
            return failure_error(end.error)
        if end.timed_out:
            return timeout_error(self.config.request_timeout)
        return shutdown_error() if end.result is None else None

    async def results(self, jobs: list[Job], request: Request) -> list[GenerationResult] | None:
        """The jobs' results once all have finished; None when the client left first; the
        APIError of the first that did not finish (a failure before a timeout)."""
        ends = await asyncio.gather(*(self.wait(job, request) for job in jobs))
        if any(end is None for end in ends):
            return None
        bad = [self.ended_badly(end) for end in ends]
        for status in (500, 504, 503):
            for error in bad:
                if error is not None and error.status == status:
                    raise error
        return [end.result for end in ends]

    async def next_event(self, job: Job):
        """The job's next event (a Chunk or its Finished), or None when none came within
        POLL_S. A job whose deadline passes while it still waits in the queue is dropped here
        (the worker only looks at a job when it reaches it)."""
        try:
            return await asyncio.wait_for(job.events.get(), POLL_S)
        except asyncio.TimeoutError:
            if job.expired() and not job.started:
                job.cancel()
                return Finished(None, timed_out=True)
            return None

    async def wait(self, job: Job, request: Request) -> Finished | None:
        """The job's end; None when the client disconnected first. A job whose client is
        gone (or whose handler is cancelled, at shutdown) is cancelled."""
        loop = asyncio.get_running_loop()
        check_at = loop.time() + POLL_S
        try:
            while not isinstance(item := await self.next_event(job), Finished):
                if loop.time() >= check_at:
                    if await request.is_disconnected():
                        return None
                    check_at = loop.time() + POLL_S
            return item
        finally:
            job.cancel()        # a no-op once the job has finished

    async def updates(self, jobs: list[Job]) -> AsyncIterator[tuple[int, Chunk | Finished]]:
        """Each job's chunks as they come and then its Finished, with the job's index. A
        client that disconnects ends the generator that reads this (cancelled or closed), and
        the `finally` cancels the jobs."""
        waiting: dict[asyncio.Future, int] = {}
        try:
            waiting = {asyncio.ensure_future(self.next_event(job)): i
                       for i, job in enumerate(jobs)}
            while waiting:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    i, item = waiting.pop(future), future.result()
                    if item is not None:
                        yield i, item
                    if not isinstance(item, Finished):
                        waiting[asyncio.ensure_future(self.next_event(jobs[i]))] = i
        finally:
            for future in waiting:
                future.cancel()
            for job in jobs:
                job.cancel()

    async def events(self, jobs: list[Job], shape: Shape, include_usage: bool):
        """Server-sent events of a streamed response in OpenAI's shape, its choices' chunks as
        they come; a choice that fails ends the response with an error event."""
        if shape.chat:
            for i in range(len(jobs)):
                yield sse(shape.chunk(i, token_ids=[], first=True))
        results = [None] * len(jobs)
        async for i, item in self.updates(jobs):
            if not isinstance(item, Finished):
                # a token whose text is held back still has its logprobs
                if item.text or shape.token_ids or shape.logprobs and item.logprobs:
                    yield sse(shape.chunk(i, item.text, item.token_ids, item.logprobs))
            elif (error := self.ended_badly(item)) is not None:
                yield sse(error.body)
                yield sse("[DONE]")
                return
            else:
                results[i] = item.result
                yield sse(shape.last_chunk(i, item.result))
        if include_usage:
            yield sse(shape.usage_chunk(results))
        yield sse("[DONE]")


def _field_path(err: dict) -> list[str]:
    """An error's location without "body" and the names pydantic gives union members."""
    return [str(p) for p in err.get("loc", ()) if p != "body" and not str(p).startswith(
        ("str", "int", "float", "bool", "list[", "dict[", "function-", "nullable["))]


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    first = errors[0]
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON ({reason})", None
    loc = _field_path(first)
    if not loc:
        return "the request body must be a JSON object with the request's fields", None
    # a union fails once per member: say what each member wanted
    wanted = dict.fromkeys(e.get("msg") for e in errors if _field_path(e) == loc)
    return f"{'.'.join(loc)}: {', or '.join(wanted)}", loc[0]


def create_app(model: Model, config: ServeConfig) -> FastAPI:
    metrics = Metrics()
    server = Server(model, config, metrics)
    profile = model.profile.as_dict() if model.profile is not None else None
    speculation = model.profile.speculation if model.profile is not None else "on"

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(server.worker.stop)

    app = FastAPI(title="longspec", lifespan=lifespan)
    app.state.server = server
    app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        if on_messages(request):
            return anthropic_error(exc.status, exc.message, exc.headers)
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        if on_messages(request):
            return anthropic_error(400, message)
        return JSONResponse(error_body(message, "invalid_request_error", param), 400)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        if on_messages(request):
            return anthropic_error(exc.status_code, str(exc.detail), exc.headers)
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"),
                            status_code=exc.status_code, headers=exc.headers)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": config.model_name, "object": "model", "created": 0, "owned_by": "longspec",
            "max_model_len": model.config.context_limit, "kernel_profile": profile}]}

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionBody):
        return await server.generate(request, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatBody):
        return await server.generate(request, body, chat=True)

    add_responses_routes(app, server)
    add_messages_routes(app, server)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type=PROMETHEUS_TYPE)

    @app.get("/health")
    async def health():
        """ok while the worker thread lives (503 once it has stopped: nothing queued would
        run); `busy_s`: how long its current step, admission or call has run so far."""
        worker = server.worker
        alive = worker.thread.is_alive()
        body = {"status": "ok" if alive else "unhealthy",
                "worker": "running" if alive else "stopped",
                "busy_s": round(worker.busy_s(), 3), "waiting": worker.waiting(),
                "running": len(worker.running), "speculation": speculation,
                "kernel_profile": profile}
        return JSONResponse(body, status_code=200 if alive else 503)

    return app

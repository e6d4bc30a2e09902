"""Prometheus metrics of the server, and the two ASGI middlewares that sit in front of every
route: request counting/latency (outermost, so refused requests count too) and the API key.

Metric names follow vLLM's where vLLM has one (spec_decode_num_draft_tokens, ...), prefixed
`longspec_`. Each app has its own registry, so several servers can live in one process.
"""

from __future__ import annotations

import hmac
import time

from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from starlette.responses import JSONResponse

from ..anthropic_api.messages import error_body as anthropic_error_body
from ..api import GenerationResult
from ..openai_api.responses import cached_tokens, error_body
from ..state.prompt_cache import PromptCache

ENDPOINTS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses",
             "/v1/messages", "/v1/messages/count_tokens", "/metrics", "/health")
# a long generation takes minutes: buckets up to the default request timeout
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, float("inf"))


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("longspec_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("longspec_request_latency_seconds",
                                 "time from request to the end of the response (streams "
                                 "included)", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.generated = Counter("longspec_generation_tokens", "new tokens generated",
                                 registry=r)
        self.steps = Counter("longspec_spec_decode_num_drafts",
                             "verify steps (one draft proposal each)", registry=r)
        self.drafted = Counter("longspec_spec_decode_num_draft_tokens",
                               "draft tokens offered for verification", registry=r)
        self.accepted = Counter("longspec_spec_decode_num_accepted_tokens",
                                "draft tokens accepted and committed", registry=r)
        self.queue = Gauge("longspec_queue_length", "requests waiting for the worker",
                           registry=r)
        self.prompt_tokens = Counter("longspec_prefix_cache_queries",
                                     "prompt tokens looked up in the prompt cache", registry=r)
        self.cached_tokens = Counter("longspec_prefix_cache_hits",
                                     "prompt tokens whose keys and values the prompt cache "
                                     "held (not computed)", registry=r)
        self.cache_bytes = Gauge("longspec_prefix_cache_bytes",
                                 "bytes the prompt cache holds", registry=r)
        self.cache_limit = Gauge("longspec_prefix_cache_limit_bytes",
                                 "the prompt cache's bound (--prompt-cache-mb)", registry=r)
        ProcessCollector(registry=r)     # process_resident_memory_bytes, CPU seconds (Linux)

    def watch_prompt_cache(self, cache: PromptCache) -> None:
        """Read the prompt cache's size at every scrape."""
        self.cache_bytes.set_function(lambda: cache.bytes)
        self.cache_limit.set_function(lambda: cache.limit_bytes)

    def observe_generation(self, result: GenerationResult) -> None:
        s = result.stats
        self.prompt_tokens.inc(result.prompt_tokens)
        self.cached_tokens.inc(cached_tokens(result))
        self.generated.inc(s["new_tokens"])
        self.steps.inc(s["steps"])
        self.drafted.inc(s["drafted_tokens"])
        self.accepted.inc(s["accepted_draft_tokens"])

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        endpoint = path if path in ENDPOINTS else "other"
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts every HTTP request by endpoint and status and times it to its last byte."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        begin, status = time.perf_counter(), 500

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.observe_request(scope["path"], status, time.perf_counter() - begin)


class ApiKeyMiddleware:
    """With a key set, every /v1 route needs `Authorization: Bearer KEY` or, as Anthropic's
    clients send it, `x-api-key: KEY` (/health and /metrics stay open, for probes and scrapers
    on the operator's side). The refusal of a Messages API route is in Anthropic's shape."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.key = None if api_key is None else api_key.encode()

    async def __call__(self, scope, receive, send):
        if self.key is not None and scope["type"] == "http" and scope["path"].startswith("/v1"):
            headers = dict(scope["headers"])
            bearer, key = headers.get(b"authorization"), headers.get(b"x-api-key")
            if not (hmac.compare_digest(bearer or b"", b"Bearer " + self.key)
                    or hmac.compare_digest(key or b"", self.key)):
                what = "missing" if bearer is None and key is None else "wrong"
                message = (f"the API key is {what}: send the header 'Authorization: Bearer KEY' "
                           "(or 'x-api-key: KEY') with the server's --api-key")
                body = (anthropic_error_body(401, message)
                        if scope["path"].startswith("/v1/messages") else
                        error_body(message, "invalid_request_error", code="invalid_api_key"))
                response = JSONResponse(body, status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


__all__ = ["PROMETHEUS_TYPE", "ApiKeyMiddleware", "Metrics", "MetricsMiddleware"]

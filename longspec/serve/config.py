"""The server's settings (no web framework imported here: the CLI reads the defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from ..drafters import METHODS
from ..engine.batching import DEFAULT_MAX_BATCH
from ..models.loader import Model


def default_method() -> str:
    """`auto` where the method registry has it, else plain decoding."""
    return "auto" if "auto" in METHODS else "ar"


@dataclass(frozen=True)
class ServeConfig:
    model_name: str                   # the id clients pass as `model` (GET /v1/models lists it)
    method: str = "ar"                # the method of requests that name none
    api_key: str | None = None        # None: no authentication
    max_queue: int = 16               # requests that may wait while a batch runs
    max_batch: int = DEFAULT_MAX_BATCH   # generations stepped together (engine/batching.py)
    request_timeout: float = 600.0    # seconds from a request's arrival to its last token
    # chat requests without max_tokens get the rest of the context, at most this many tokens:
    # longspec allocates the KV cache of the whole generation up front
    default_max_tokens: int = 4096
    draft_model: Model | None = None  # given to methods that need one
    heads: str | None = None          # given to methods that take heads

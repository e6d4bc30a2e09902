"""The server's settings (no web framework imported here: the CLI reads the defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..drafters import METHODS
from ..engine.batching import DEFAULT_MAX_BATCH
from ..models.loader import Model


def default_method() -> str:
    """`auto` where the method registry has it, else plain decoding."""
    return "auto" if "auto" in METHODS else "ar"


def served_name(model: str) -> str:
    """The id MODEL is served as by default: a bundled name as given; a file's or directory's
    path, or a Hub id, by its last part (a GGUF file's without `.gguf`). Clients read a "/"
    in a model id as a provider's prefix (the OpenAI Agents SDK refuses one it does not know)."""
    name = Path(model.rstrip("/") or model).name or model
    return name.removesuffix(".gguf")


@dataclass(frozen=True)
class ServeConfig:
    model_name: str                   # the id clients pass as `model` (GET /v1/models lists it)
    aliases: tuple[str, ...] = ()     # other ids a request may name (MODEL as given)
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
    tool_format: str | None = None    # how the model writes tool calls; None: its template's

"""longspec: lossless speculative decoding for long generation."""

from .api import Chunk, GenerationResult, Request, Stream, generate, stream
from .drafters import METHODS, MethodSpec, method_names
from .many import generate_many, stream_many
from .models import Model, demo_path, fetch_model, load_model
from .sampling.logits import SamplingConfig

__version__ = "0.1.0"

__all__ = ["METHODS", "Chunk", "GenerationResult", "MethodSpec", "Model", "Request",
           "SamplingConfig", "Stream", "demo_path", "fetch_model", "generate",
           "generate_many", "load_model", "method_names", "stream", "stream_many"]

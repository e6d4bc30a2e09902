"""longspec: lossless speculative decoding for long generation."""

from .api import Chunk, GenerationResult, Stream, generate, stream
from .drafters import method_names
from .models import Model, demo_path, fetch_model, load_model
from .sampling import SamplingConfig

__version__ = "0.1.0"

__all__ = ["Chunk", "GenerationResult", "Model", "SamplingConfig", "Stream", "demo_path",
           "fetch_model", "generate", "load_model", "method_names", "stream"]

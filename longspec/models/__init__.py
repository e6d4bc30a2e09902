"""The Llama-family backend: configuration, RoPE, the compact transformer, its loader and the
sources it loads from (checkpoint directories, GGUF files, Hub ids, bundled names)."""

from ..step.forward import ForwardOutput
from .config import SUPPORTED_MODEL_TYPES, ModelConfig, config_from_hf, read_config
from .loader import Model, demo_path, load_model
from .sources import fetch_model, longspec_home
from .transformer import Transformer

__all__ = ["SUPPORTED_MODEL_TYPES", "ForwardOutput", "Model", "ModelConfig", "Transformer",
           "config_from_hf", "demo_path", "fetch_model", "load_model", "longspec_home",
           "read_config"]

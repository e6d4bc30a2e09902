"""The Llama-family backend: configuration, RoPE, the compact transformer and its loader."""

from .config import SUPPORTED_MODEL_TYPES, ModelConfig, config_from_hf, read_config
from .loader import Model, demo_path, load_model
from .transformer import ForwardOutput, Transformer

__all__ = ["SUPPORTED_MODEL_TYPES", "ForwardOutput", "Model", "ModelConfig", "Transformer",
           "config_from_hf", "demo_path", "load_model", "read_config"]

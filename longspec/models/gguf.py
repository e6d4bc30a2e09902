"""Read a GGUF file (llama.cpp's format) as a Hugging Face checkpoint would be read: the config
from its metadata (gguf_file.py reads the file), its tensors dequantized by the `gguf` package
and renamed to Hugging Face names, and its tokenizer (with the chat template) converted by
transformers.

Two things differ from a Hugging Face checkpoint besides names:
- llama.cpp's converter permutes the rows of the q and k projections of the `llama` architecture
  (llama.cpp rotates interleaved pairs, Hugging Face checkpoints rotate halves); `unpermute`
  undoes it. `qwen2` and `qwen3` are written as they are (llama.cpp rotates halves for them).
- llama3 RoPE scaling is not in the metadata: the converter writes one divisor per frequency as
  the tensor `rope_freqs.weight`, kept here as `RopeConfig.freq_factors`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from .compiled import int4_mm
from .config import ModelConfig, config_from_hf
from .gguf_file import GGUFFile
from .quant import KERNEL_TYPES, SIXTEEN_TYPES, Blocks, unpermute_rows
from .sources import longspec_home

log = logging.getLogger(__name__)

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}  # GGUF name -> model_type
# what longspec reads; the gguf package dequantizes more, but only these are tested here
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K")
TOP_TENSORS = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# RoPE scaling keys understood (after '{arch}.rope.scaling.'); any other one is refused
SCALING_KEYS = ("type", "factor", "original_context_length", "yarn_beta_fast", "yarn_beta_slow",
                "finetuned")
# llama.cpp ends generation at any of these (its end-of-generation set, for these models)
EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id")


def open_gguf(path: Path) -> GGUFFile:
    """The file's reader (metadata parsed, tensors memory-mapped, nothing dequantized yet)."""
    try:
        return GGUFFile(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"cannot read {path} as a GGUF file: {e}") from None


def metadata(reader: GGUFFile, key: str, default=None):
    return reader.fields.get(key, default)


def hf_name(gguf_name: str) -> str:
    """'blk.3.attn_q.weight' -> 'layers.3.self_attn.q_proj.weight' (without 'model.')."""
    parts = gguf_name.split(".")
    if len(parts) == 2 and parts[0] in TOP_TENSORS:
        return f"{TOP_TENSORS[parts[0]]}.{parts[1]}"
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_TENSORS:
        return f"layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.{parts[3]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} is not part of a dense Llama-family model "
                     "(mixture of experts and other architectures are not supported)")


def _rope(reader, arch: str) -> dict:
    prefix = f"{arch}.rope.scaling."
    unknown = [k for k in reader.fields if k.startswith(prefix)
               and k.removeprefix(prefix) not in SCALING_KEYS]
    if unknown:
        raise ValueError(f"GGUF RoPE setting {unknown[0]!r} is not supported")
    rope = {"rope_theta": metadata(reader, f"{arch}.rope.freq_base")}
    kind = metadata(reader, prefix + "type", "none")
    if kind == "none":
        return {**rope, "rope_type": "default"}
    if kind not in ("linear", "yarn"):
        raise ValueError(f"GGUF RoPE scaling {kind!r} is not supported; supported: linear, yarn")
    rope.update(rope_type=kind, factor=metadata(reader, prefix + "factor"))
    if kind == "yarn":
        rope.update(original_max_position_embeddings=metadata(reader,
                                                              prefix + "original_context_length"),
                    beta_fast=metadata(reader, prefix + "yarn_beta_fast"),
                    beta_slow=metadata(reader, prefix + "yarn_beta_slow"))
    return rope


def gguf_config(reader, path: Path) -> ModelConfig:
    """The ModelConfig the metadata describes, checked as a config.json would be."""
    arch = metadata(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} of {path.name} is not supported; supported: "
                         f"{', '.join(ARCHITECTURES)} (Mistral files are 'llama')")
    if metadata(reader, f"{arch}.expert_count"):
        raise ValueError(f"{path.name} is a mixture-of-experts model, which is not supported")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path.name} lacks the tensor 'token_embd.weight'")

    def key(name: str):
        return metadata(reader, f"{arch}.{name}")

    head_dim = key("attention.key_length")
    rotary = key("rope.dimension_count")
    if head_dim and rotary and rotary != head_dim:
        raise ValueError(f"{path.name} rotates {rotary} of {head_dim} dimensions per head; partial "
                         "rotary embeddings are not supported")
    eos = [metadata(reader, k) for k in EOS_KEYS]
    d = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": int(tensors["token_embd.weight"].shape[-1]),  # ggml order: [hidden, vocab]
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": key("attention.head_count_kv"),
        "head_dim": head_dim or rotary,
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_parameters": _rope(reader, arch),
        # llama.cpp writes the output projection only when it is not the embedding
        "tie_word_embeddings": "output.weight" not in tensors,
        "eos_token_id": sorted({i for i in eos if i is not None}),
        "bos_token_id": metadata(reader, "tokenizer.ggml.bos_token_id"),
    }
    config = config_from_hf(d, where=f"GGUF metadata of {path.name}")
    if "rope_freqs.weight" in tensors:
        factors = _dequantize(tensors["rope_freqs.weight"], torch.float32)
        if factors.numel() != config.head_dim // 2:
            raise ValueError(f"{path.name}: rope_freqs has {factors.numel()} factors, expected "
                             f"{config.head_dim // 2}")
        rope = dataclasses.replace(config.rope, freq_factors=tuple(factors.tolist()))
        config = dataclasses.replace(config, rope=rope)
    return config


def check_tensor_types(reader, path: Path) -> None:
    """Refuse, before dequantizing anything, a file that holds a type longspec does not read."""
    for t in reader.tensors:
        if t.tensor_type.name not in TENSOR_TYPES:
            raise ValueError(f"{path.name}: tensor {t.name!r} is {t.tensor_type.name}, which "
                             f"longspec does not load; supported: {', '.join(TENSOR_TYPES)}")


def gguf_numel(reader) -> int:
    return sum(int(t.n_elements) for t in reader.tensors)


def _dequantize(tensor, dtype: torch.dtype) -> torch.Tensor:
    from gguf.quants import dequantize

    values = dequantize(tensor.data, tensor.tensor_type)       # float32, fresh unless F32
    if not values.flags.writeable:                            # F32 comes back as the file's map
        values = np.array(values)
    shape = tuple(int(n) for n in reversed(tensor.shape))      # ggml lists dims fastest first
    return torch.from_numpy(values).reshape(shape).to(dtype)


def unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q or k projection (weight [heads * head_dim, in] or bias [heads * head_dim])
    from llama.cpp's interleaved-pair order back to the halves order of Hugging Face."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2,
                     *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_tensors(reader, config: ModelConfig, dtype: torch.dtype,
                 keep_quantized: bool = False) -> dict:
    """Every weight under its Hugging Face name (without 'model.'): matrices in a format the
    int4 kernel reads as their `Blocks` when `keep_quantized`, everything else dequantized into
    `dtype`, one tensor at a time so that only the result is held in full."""
    arch = metadata(reader, "general.architecture")
    wanted = [t for t in reader.tensors if t.name != "rope_freqs.weight"]
    names = [hf_name(t.name) for t in wanted]                  # unknown tensors fail here, early

    def load(t):
        kept = t.tensor_type.name in KERNEL_TYPES + SIXTEEN_TYPES   # build.py decides how
        if keep_quantized and kept and len(t.shape) == 2:
            shape = tuple(int(n) for n in reversed(t.shape))
            return Blocks(t.tensor_type.name, np.asarray(t.data), shape)
        return _dequantize(t, dtype)

    # numpy releases the GIL while dequantizing: two threads nearly halve the time on 2 cores
    with ThreadPoolExecutor(max_workers=2) as pool:
        weights = dict(zip(names, pool.map(load, wanted)))
    if arch == "llama":
        heads = {".q_proj.": config.num_heads, ".k_proj.": config.num_kv_heads}
        for name, w in weights.items():
            for part, n in heads.items():
                if part in name:
                    weights[name] = (unpermute_rows(w, n) if isinstance(w, Blocks)
                                     else unpermute(w, n))
    return weights


def is_quantized(reader) -> bool:
    """Whether the file holds matrices the int4 kernel can run without dequantizing (Q6_K ones
    where longspec::int4_mm runs: build.py keeps them quantized there)."""
    types = {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2}
    return bool(types & set(KERNEL_TYPES)) or bool(types & set(SIXTEEN_TYPES)) and int4_mm()


def gguf_tokenizer(reader: GGUFFile, path: Path):
    """transformers' tokenizer converted from the file's vocabulary (with its chat template), or
    None when the file has no tokenizer. The conversion (~10 s for a 150K-token vocabulary) is
    kept under longspec_home()/tokenizers, by the file and the converter's versions, and read
    back from there by later loads: the tokenizer saved and read again is the same one."""
    if metadata(reader, "tokenizer.ggml.model") is None:
        return None
    from transformers import AutoTokenizer

    kept = _kept_tokenizer(path)
    if (kept / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(kept))
        except (OSError, ValueError, KeyError) as e:
            log.warning("the tokenizer kept in %s does not load (%s): converting it again", kept, e)
            shutil.rmtree(kept, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError, KeyError, NotImplementedError) as e:
        raise ValueError(f"cannot convert the tokenizer of {path.name}: {e}") from None
    _keep_tokenizer(tokenizer, kept)
    return tokenizer


def _kept_tokenizer(path: Path) -> Path:
    """Where the tokenizer converted from this file is kept: named by the file (its path, size
    and modification time) and the versions of transformers and tokenizers that converted it."""
    import tokenizers
    import transformers

    stat = path.stat()
    key = (f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}|"
           f"{tokenizers.__version__}")
    return longspec_home() / "tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:16]


def _keep_tokenizer(tokenizer, kept: Path) -> None:
    """Save the tokenizer where _kept_tokenizer says, whole or not at all (written beside it, then
    renamed: another process may be keeping the same one); where it cannot be written, loads
    convert it again."""
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(dir=kept.parent)
    except OSError as e:
        log.info("the converted tokenizer is not kept (%s)", e)
        return
    try:
        tokenizer.save_pretrained(scratch)
        os.replace(scratch, kept)
    except OSError as e:
        log.info("the converted tokenizer is not kept (%s)", e)
        shutil.rmtree(scratch, ignore_errors=True)

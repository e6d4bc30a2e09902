"""Model configuration: one frozen dataclass read from a Hugging Face `config.json` (or a dict
in its layout, as the GGUF reader builds one), every field it reads checked for its type.

Both layouts of the RoPE settings are understood: transformers 5 (`rope_parameters`) and the
legacy one (`rope_theta` plus `rope_scaling` with `type` or `rope_type`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class RopeConfig:
    theta: float = DEFAULT_ROPE_THETA
    type: str = "default"
    factor: float = 1.0
    # context length the model was pretrained on (llama3, yarn)
    original_max_positions: int | None = None
    low_freq_factor: float = 1.0          # llama3
    high_freq_factor: float = 4.0         # llama3
    beta_fast: float = 32.0               # yarn
    beta_slow: float = 1.0                # yarn
    attention_factor: float | None = None  # yarn: scale of cos/sin (None: derived from factor)
    mscale: float | None = None           # yarn
    mscale_all_dim: float | None = None   # yarn
    truncate: bool = True                 # yarn: round the correction range to whole dims
    # GGUF files carry llama3 scaling as one divisor per frequency (llama.cpp's rope_freqs tensor)
    freq_factors: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int                # query heads
    num_kv_heads: int             # key/value heads (GQA when fewer than query heads)
    head_dim: int
    max_positions: int            # max_position_embeddings
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qk_norm: bool = False         # Qwen3: RMSNorm over head_dim on queries and keys
    sliding_window: int | None = None
    rope: RopeConfig = field(default_factory=RopeConfig)
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def context_limit(self) -> int:
        """Most positions a sequence may use: beyond the trained length only where the RoPE
        scaling extends it, and never past a sliding window (not implemented: docs/models.md,
        "Limits")."""
        limit = self.max_positions
        if self.rope.type == "dynamic":
            limit = int(self.max_positions * self.rope.factor)
        if self.sliding_window:
            limit = min(limit, self.sliding_window)
        return limit

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


_REQUIRED = object()
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _field(d: dict, key: str, kind: type, default=_REQUIRED, minimum: float | None = None,
           where: str = "config.json"):
    """d[key] checked to be of `kind` (and >= minimum); `default` when absent or null."""
    value = d.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"{where} lacks the field {key!r}")
        return default
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        # bool is an int in Python: `"hidden_size": true` must not pass as 1
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None and ok else ""
        raise ValueError(f"{where} field {key!r} must be {_KINDS[kind]}{bound}, got {value!r}")
    return kind(value)


def _rope_from_hf(d: dict, where: str) -> RopeConfig:
    params = d.get("rope_parameters")
    if params is None:
        params = d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{where} field 'rope_parameters' (or 'rope_scaling') must be an object, "
                         f"got {params!r}")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer-type RoPE parameters are not supported by the "
                         "Llama-family backend")
    merged = {**d, **params}      # a field of the RoPE parameters wins over the top-level one

    def num(key: str, default=None) -> float | None:
        return _field(merged, key, float, default, where=where)

    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported RoPE type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
    original = _field(merged, "original_max_position_embeddings", int, None, 1, where)
    if rope_type in ("llama3", "yarn") and original is None:
        original = _field(d, "max_position_embeddings", int, minimum=1, where=where)
    factor = num("factor")
    if factor is None:
        trained = _field(d, "max_position_embeddings", int, minimum=1, where=where)
        factor = trained / original if rope_type == "yarn" else 1.0
    return RopeConfig(
        theta=num("rope_theta", DEFAULT_ROPE_THETA), type=rope_type, factor=factor,
        original_max_positions=original,
        low_freq_factor=num("low_freq_factor", 1.0),
        high_freq_factor=num("high_freq_factor", 4.0),
        beta_fast=num("beta_fast") or 32.0,
        beta_slow=num("beta_slow") or 1.0,
        attention_factor=num("attention_factor"),
        mscale=num("mscale"), mscale_all_dim=num("mscale_all_dim"),
        truncate=_field(params, "truncate", bool, True, where=where),
    )


def as_ids(value, key: str = "eos_token_id", where: str = "config.json") -> tuple[int, ...]:
    """Token ids given as one id, a list of ids or null."""
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"{where} field {key!r} must be a token id or a list of them, "
                         f"got {value!r}")
    return tuple(values)


def config_from_hf(d: dict, where: str = "config.json") -> ModelConfig:
    """Build a `ModelConfig` from the dict of a Hugging Face `config.json`, checking the type of
    every field it reads (`where` names the source in errors)."""
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model type {model_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    quant = d.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else quant
        raise ValueError(f"{where} declares a quantization_config ({method}): longspec loads "
                         "plain float safetensors or GGUF files; use the unquantized checkpoint "
                         "or a GGUF")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (the Llama family uses 'silu')")
    if d.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor other than 1.0 is not supported")

    def pos_int(key: str, default=_REQUIRED) -> int:
        return _field(d, key, int, default, 1, where)

    heads = pos_int("num_attention_heads")
    hidden = pos_int("hidden_size")
    head_dim = pos_int("head_dim", None) or (128 if model_type == "qwen3" else hidden // heads)
    sliding = pos_int("sliding_window", None)
    if model_type in ("qwen2", "qwen3") and not _field(d, "use_sliding_window", bool, False,
                                                       where=where):
        sliding = None
    kv_heads = pos_int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of "
                         f"num_key_value_heads {kv_heads}")
    return ModelConfig(
        model_type=model_type,
        vocab_size=pos_int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=pos_int("intermediate_size"),
        num_layers=pos_int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_positions=pos_int("max_position_embeddings", 2048),
        rms_norm_eps=_field(d, "rms_norm_eps", float, 1e-6, 0, where),
        tie_word_embeddings=_field(d, "tie_word_embeddings", bool, False, where=where),
        qk_norm=model_type == "qwen3",
        sliding_window=sliding,
        rope=_rope_from_hf(d, where),
        eos_token_ids=as_ids(d.get("eos_token_id"), where=where),
        bos_token_id=_field(d, "bos_token_id", int, None, 0, where),
    )


def read_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no config.json: "
                         "pass a Hugging Face checkpoint directory")
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return config_from_hf(d)

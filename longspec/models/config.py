"""Model configuration: one frozen dataclass read from a Hugging Face `config.json`.

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
        scaling extends it, and never past a sliding window (not implemented: see README)."""
        limit = self.max_positions
        if self.rope.type == "dynamic":
            limit = int(self.max_positions * self.rope.factor)
        if self.sliding_window:
            limit = min(limit, self.sliding_window)
        return limit

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def _rope_from_hf(d: dict) -> RopeConfig:
    params = d.get("rope_parameters")
    if params is None:
        params = dict(d.get("rope_scaling") or {})
    else:
        params = dict(params)
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer-type RoPE parameters are not supported by the Llama-family "
                         "backend")
    theta = params.get("rope_theta", d.get("rope_theta", DEFAULT_ROPE_THETA))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported RoPE type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
    original = params.get("original_max_position_embeddings",
                          d.get("original_max_position_embeddings"))
    if rope_type in ("llama3", "yarn") and original is None:
        original = d["max_position_embeddings"]
    factor = params.get("factor")
    if factor is None:
        factor = d["max_position_embeddings"] / original if rope_type == "yarn" else 1.0
    return RopeConfig(
        theta=float(theta), type=rope_type, factor=float(factor),
        original_max_positions=original,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=params.get("attention_factor"),
        mscale=params.get("mscale"), mscale_all_dim=params.get("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
    )


def as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def config_from_hf(d: dict) -> ModelConfig:
    """Build a `ModelConfig` from the dict of a Hugging Face `config.json`."""
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model type {model_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (the Llama family uses 'silu')")
    if d.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor other than 1.0 is not supported")
    try:
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or (128 if model_type == "qwen3"
                                         else d["hidden_size"] // heads)
        sliding = d.get("sliding_window")
        if model_type in ("qwen2", "qwen3") and not d.get("use_sliding_window", False):
            sliding = None
        kv_heads = d.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads {heads} is not a multiple of "
                             f"num_key_value_heads {kv_heads}")
        return ModelConfig(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_positions=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            qk_norm=model_type == "qwen3",
            sliding_window=sliding,
            rope=_rope_from_hf(d),
            eos_token_ids=as_ids(d.get("eos_token_id")),
            bos_token_id=d.get("bos_token_id"),
        )
    except KeyError as e:
        raise ValueError(f"config.json lacks the field {e.args[0]!r}") from None


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

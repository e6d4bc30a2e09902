"""Tiny random checkpoints of every supported family, saved as transformers saves them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import library

import longspec

# where the exactness tests run (test_lossless, test_prefix, test_batch_invariance): "cpu", or
# "cuda" on a machine with a GPU (`LONGSPEC_TEST_DEVICE=cuda pytest ...`)
DEVICE = os.environ.get("LONGSPEC_TEST_DEVICE", "cpu")

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama-bias": ("LlamaConfig", "LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
    "qwen3-head48": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 48}),
}

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 32},
}


def make_checkpoint(out: Path, family: str = "llama", rope: str = "default", *,
                    legacy: bool = False, tied: bool = False, kv_heads: int = 2, heads: int = 4,
                    vocab: int = 300, max_positions: int = 128, shard_bytes: int | None = None,
                    seed: int = 0, hidden: int = 64, intermediate: int = 128):
    """Save a random tiny model of `family` to `out`; return the transformers model (fp32, eval).

    `legacy` rewrites config.json in the old layout (rope_theta + rope_scaling with 'type').
    """
    import transformers

    config_cls, model_cls, extra = FAMILIES[family]
    params = dict(ROPES[rope])
    if rope == "yarn":
        max_positions = 128
    config = getattr(transformers, config_cls)(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=tied, rope_parameters=params,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    kwargs = {"max_shard_size": shard_bytes} if shard_bytes else {}
    model.save_pretrained(out, **kwargs)
    if legacy:
        path = Path(out) / "config.json"
        d = json.loads(path.read_text())
        rope_params = d.pop("rope_parameters")
        d["rope_theta"] = rope_params.pop("rope_theta")
        kind = rope_params.pop("rope_type")
        if kind != "default":
            d["rope_scaling"] = {"type": kind, **rope_params}
        path.write_text(json.dumps(d))
    return model


def last_bit_flipped(t: torch.Tensor) -> torch.Tensor:
    """`t` with the lowest bit of every element flipped: a sum taken in another order."""
    bits = {2: torch.int16, 4: torch.int32}[t.element_size()]
    return (t.view(bits) ^ 1).view(t.dtype)


def our_logits(model, ids):
    """longspec's logits [len(ids), vocab] for a prompt run in one causal forward."""
    from longspec.cache import StaticCache, causal_mask

    net = model.net
    cache = StaticCache(model.config, len(ids), model.dtype, "cpu")
    out = net(ids, torch.arange(len(ids)), cache, causal_mask(len(ids), model.dtype, "cpu"))
    return out.logits


def hf_greedy(hf, ids, n):
    """transformers' greedy continuation of `ids`: exactly n new token ids."""
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    out = hf.generate(ids[None], max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(ids):].tolist()


def assert_matches_ar(model, prompt, method: str, max_new_tokens: int,
                      options: dict | None = None, heads=None, draft_model=None, **settings):
    """Generate with `method` (and its `options`, `heads` and `draft_model`) and with plain
    decoding (`ar`), same seed and settings, EOS ignored; assert the token ids are identical,
    and return the method's result."""
    settings = {"ignore_eos": True, **settings}
    ref = longspec.generate(model, prompt, max_new_tokens=max_new_tokens, method="ar",
                            **settings)
    res = longspec.generate(model, prompt, max_new_tokens=max_new_tokens, method=method,
                            options=options, heads=heads, draft_model=draft_model, **settings)
    assert res.token_ids == ref.token_ids, (
        f"{method} differs from ar from token "
        f"{next(i for i, (a, b) in enumerate(zip(res.token_ids, ref.token_ids)) if a != b)}"
        if len(res.token_ids) == len(ref.token_ids) else
        f"{method} wrote {len(res.token_ids)} tokens, ar {len(ref.token_ids)}")
    return res


def opcheck_int4_mm(x, codes, scales) -> None:
    """PyTorch's operator checks (schema, fake tensors, autograd registration) on
    longspec::int4_mm with these operands."""
    library.opcheck(torch.ops.longspec.int4_mm.default, (x, codes, scales),
                    test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))

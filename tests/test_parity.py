"""Our backend against transformers on tiny random checkpoints of every family and RoPE type."""

import pytest
import torch
from helpers import FAMILIES, ROPES, hf_greedy, make_checkpoint, our_logits

import longspec

TOL = 2e-5


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("tied", [False, True])
def test_family_logits_and_greedy_match_transformers(tmp_path, family, tied):
    hf = make_checkpoint(tmp_path, family, tied=tied)
    model = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert torch.allclose(our_logits(model, ids), ref, atol=TOL, rtol=0)
    res = longspec.generate(model, ids.tolist(), max_new_tokens=24, ignore_eos=True, method="ar",
                            sampling=longspec.SamplingConfig(temperature=0))
    assert res.token_ids == hf_greedy(hf, ids, 24)


# dynamic scaling rotates each position as transformers does when it decodes that position
# (the greedy test below), not as it does a 100-token prompt in one forward
@pytest.mark.parametrize("rope", sorted(set(ROPES) - {"dynamic"}))
@pytest.mark.parametrize("legacy", [False, True])
def test_rope_variant_logits_match_transformers(tmp_path, rope, legacy):
    hf = make_checkpoint(tmp_path, "llama", rope, legacy=legacy, max_positions=64)
    model = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    assert model.config.rope.type == rope
    # past max_position_embeddings, where linear, dynamic, llama3 and yarn all differ from default
    ids = torch.randint(0, 300, (100,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert torch.allclose(our_logits(model, ids), ref, atol=TOL, rtol=0)


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_rope_variant_greedy_matches_transformers_generate(tmp_path, rope):
    hf = make_checkpoint(tmp_path, "llama", rope, max_positions=64)
    model = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(3))
    # dynamic scaling alone extends the context: its decoding crosses the trained 64 positions
    new = 50 if rope == "dynamic" else 30
    res = longspec.generate(model, ids.tolist(), max_new_tokens=new, ignore_eos=True, method="ar",
                            sampling=longspec.SamplingConfig(temperature=0))
    assert res.token_ids == hf_greedy(hf, ids, new)


def test_multi_head_attention_and_sharded_checkpoint(tmp_path):
    hf = make_checkpoint(tmp_path, "qwen2", kv_heads=4, shard_bytes=60_000)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    ids = torch.randint(0, 300, (32,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert torch.allclose(our_logits(model, ids), ref, atol=TOL, rtol=0)


def test_demo_model_loads_in_transformers_with_equal_logits():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = longspec.demo_path("demo")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    model = longspec.load_model("demo", dtype="float32", device="cpu")
    ids = torch.tensor(tok("def main():\n    return 0\n")["input_ids"])
    assert ids.tolist() == model.tokenizer("def main():\n    return 0\n")["input_ids"]
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert torch.allclose(our_logits(model, ids), ref, atol=1e-4, rtol=0)

"""GGUF files, written as llama.cpp's converter writes them, load to the model the file holds:
logits match transformers' on the same (dequantized) weights, greedy output too."""

import numpy as np
import pytest
import torch
from gguf_writer import CHAT_TEMPLATE, K_QUANTS, encode, reference, write_gguf
from helpers import hf_greedy, make_checkpoint, our_logits

import longspec
from longspec.models.linear import DenseLinear

TOL = 2e-5
FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0"]


def check_parity(tmp_path, family, qtype, rope="default", tied=False, **sizes):
    hf = make_checkpoint(tmp_path / "hf", family, rope, tied=tied, max_positions=64, **sizes)
    ref = reference(hf, write_gguf(hf, tmp_path / "m.gguf", qtype))
    model = longspec.load_model(tmp_path / "m.gguf", dtype="float32", device="cpu",
                                dequantize=True)
    assert model.config.tie_word_embeddings == tied
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(ids[None]).logits[0]
    assert torch.allclose(our_logits(model, ids), expected, atol=TOL, rtol=0)
    res = longspec.generate(model, ids.tolist(), max_new_tokens=16, ignore_eos=True,
                            sampling=longspec.SamplingConfig(temperature=0))
    assert res.token_ids == hf_greedy(ref, ids, 16)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_of_every_family_and_type_matches_transformers(tmp_path, family, qtype):
    check_parity(tmp_path, family, qtype)


@pytest.mark.parametrize("qtype", sorted(K_QUANTS))
def test_gguf_k_quants_match_transformers(tmp_path, qtype):
    # K-quant blocks hold 256 values: rows must be multiples of 256
    check_parity(tmp_path, "llama", qtype, hidden=256, intermediate=512)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_gguf_with_tied_embeddings(tmp_path, family):
    check_parity(tmp_path, family, "Q8_0", tied=True)


def test_gguf_llama_with_biases(tmp_path):
    # the converter permutes the q and k biases as it permutes their weights
    check_parity(tmp_path, "llama-bias", "Q8_0")


@pytest.mark.parametrize("rope", ["linear", "yarn", "llama3"])
def test_gguf_rope_scaling_matches_transformers(tmp_path, rope):
    # llama3 scaling travels as the rope_freqs tensor, linear and yarn as metadata
    check_parity(tmp_path, "llama", "F32", rope)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_gguf_loads_like_transformers_gguf_loader(tmp_path, family):
    """transformers reads the file on its own (its own q/k un-permutation for llama)."""
    from transformers import AutoModelForCausalLM

    hf = make_checkpoint(tmp_path / "hf", family)
    write_gguf(hf, tmp_path / "m.gguf", "Q8_0", tokenizer=True)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf",
                                                  dtype=torch.float32).eval()
    model = longspec.load_model(tmp_path / "m.gguf", dtype="float32", device="cpu",
                                dequantize=True)
    ids = torch.randint(0, 300, (32,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = theirs(ids[None]).logits[0]
    assert torch.allclose(our_logits(model, ids), expected, atol=TOL, rtol=0)


def test_gguf_tokenizer_chat_template_and_end_of_turn(tmp_path):
    from transformers import AutoTokenizer

    hf = make_checkpoint(tmp_path / "hf", "qwen2")
    write_gguf(hf, tmp_path / "m.gguf", "Q4_0", tokenizer=True)
    model = longspec.load_model(tmp_path / "m.gguf", dtype="float32", device="cpu")
    assert model.path == tmp_path / "m.gguf" and model.name == "m"
    assert model.source.kind == "gguf"
    assert model.eos_token_ids == {0, 2}          # eos and eot (<|im_end|>) of the metadata
    tok = model.tokenizer
    assert tok.chat_template == CHAT_TEMPLATE
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    text = tok.apply_chat_template([{"role": "user", "content": "the shore"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nthe shore<|im_end|>\n<|im_start|>assistant\n"
    assert tok(text)["input_ids"] == theirs(text)["input_ids"]
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2


def test_gguf_in_bfloat16_holds_the_float32_weights_rounded(tmp_path):
    hf = make_checkpoint(tmp_path / "hf", "llama")
    write_gguf(hf, tmp_path / "m.gguf", "Q8_0")
    half = longspec.load_model(tmp_path / "m.gguf", dtype="bfloat16", device="cpu",
                               dequantize=True)
    full = longspec.load_model(tmp_path / "m.gguf", dtype="float32", device="cpu",
                               dequantize=True)
    assert half.dtype == torch.bfloat16 and half.weight_format == "bfloat16"
    for (name, a), b in zip(half.net.named_modules(), full.net.modules()):
        if isinstance(a, DenseLinear):   # float32 keeps [in, out]: compare as [out, in]
            assert torch.equal(a.dense_weight, b.dense_weight.bfloat16()), name
    for (name, a), b in zip(half.net.named_parameters(), full.net.parameters()):
        if a.dim() == 1:
            assert torch.equal(a, b.bfloat16()), name


@pytest.mark.unit
@pytest.mark.parametrize("qtype", sorted(K_QUANTS))
def test_k_quant_dequantization_matches_transformers_kernels(qtype):
    """gguf-py's numpy dequantization against transformers' independent torch one."""
    dequant = pytest.importorskip("transformers.integrations.gguf.dequant")
    import gguf

    rng = np.random.default_rng(0)
    raw, values = encode(np.zeros((4, 512), np.float32), qtype, rng)
    kind = gguf.GGMLQuantizationType[qtype]
    theirs = dequant.dequantize(torch.from_numpy(raw.reshape(-1)), int(kind)).reshape(4, 512)
    assert torch.equal(torch.from_numpy(values), theirs)


def test_gguf_with_unsupported_type_or_architecture_is_refused(tmp_path):
    import gguf

    hf = make_checkpoint(tmp_path / "hf", "llama")
    write_gguf(hf, tmp_path / "m.gguf", "Q5_1")
    with pytest.raises(ValueError, match="is Q5_1, which longspec does not load; supported: F32"):
        longspec.load_model(tmp_path / "m.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma2")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    for write in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file,
                  w.close):
        write()
    with pytest.raises(ValueError,
                       match="architecture 'gemma2' .* not supported; supported: llama"):
        longspec.load_model(tmp_path / "g.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(ValueError, match="cannot read .* as a GGUF file"):
        longspec.load_model(tmp_path / "bad.gguf")


def test_a_quantized_lm_head_reads_back_as_its_dense_weights(tmp_path):
    """Drafters train on the LM head's rows; a GGUF's head stays quantized and is read back
    through its own product, what the dequantized file holds up to bfloat16's rounding."""
    # (a vocabulary of whole tiles of 16 rows: the int4 kernels' layout, so the head is kept)
    hf = make_checkpoint(tmp_path / "hf", "llama", vocab=320, max_positions=64)
    write_gguf(hf, tmp_path / "m.gguf", "Q4_0")
    kept = longspec.load_model(tmp_path / "m.gguf", dtype="bfloat16", device="cpu")
    dense = longspec.load_model(tmp_path / "m.gguf", dtype="bfloat16", device="cpu",
                                dequantize=True)
    assert not isinstance(kept.net.lm_head, DenseLinear)
    head, expected = kept.net.dense_head(), dense.net.dense_head()
    assert head.shape == expected.shape and head.dtype == torch.bfloat16
    scale = expected.float().abs().max()
    assert torch.allclose(head.float(), expected.float(), atol=0.01 * scale, rtol=2 ** -7)
    assert kept.net.dense_head() is head       # read once

"""A target and a draft model as GGUF files of the Qwen2 family (the 1.5B and 0.5B pair in
small): sharing a tokenizer, `draft` and `triforce` write exactly what plain decoding writes;
a draft with another vocabulary, or another tokenizer of the same size, is refused."""

import pytest
from gguf_writer import write_gguf
from helpers import assert_matches_ar, make_checkpoint

import longspec

# as Qwen2.5-Coder's files: the target in Q4_K with Q6_K beside it, the draft mostly Q5_0
TARGET_MIX = {"default": "Q4_K", "ffn_down": "Q6_K", "attn_v": "Q6_K", "output": "Q6_K"}
DRAFT_MIX = {"default": "Q5_0", "ffn_down": "Q8_0", "output": "Q8_0"}
SHAPE = {"hidden": 256, "intermediate": 512, "heads": 4, "kv_heads": 2,
         "max_positions": 2048}


def qwen_gguf(path, mix, seed: int, vocab: int = 320, tokenizer: bool | str = True):
    hf = make_checkpoint(path.parent / f"{path.stem}-hf", "qwen2", vocab=vocab, seed=seed,
                         **SHAPE)
    write_gguf(hf, path, mix, tokenizer=tokenizer, seed=seed)
    return longspec.load_model(path, device="cpu")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen_pair")
    return qwen_gguf(path / "target.gguf", TARGET_MIX, 0), qwen_gguf(path / "draft.gguf",
                                                                      DRAFT_MIX, 1)


@pytest.mark.parametrize("method", ["draft", "triforce"])
@pytest.mark.parametrize("sampling", [longspec.SamplingConfig(temperature=0),
                                      longspec.SamplingConfig(temperature=0.8, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_a_draft_model_of_the_same_family_writes_what_ar_writes(pair, method, sampling):
    target, draft = pair
    assert target.weight_format == draft.weight_format == "int4"
    res = assert_matches_ar(target, [5, 6, 7, 8, 9, 10], method, 40, sampling=sampling, seed=3,
                            draft_model=draft)
    assert res.stats["method"] == method


def test_a_draft_with_another_vocabulary_is_refused(pair, tmp_path):
    target, _ = pair
    other = qwen_gguf(tmp_path / "other.gguf", DRAFT_MIX, 1, vocab=336)
    with pytest.raises(ValueError, match=r"vocabulary \(336\) differs from the target's \(320\)"):
        longspec.generate(target, [5, 6, 7], max_new_tokens=4, method="draft", draft_model=other)


def test_a_draft_with_another_tokenizer_of_the_same_size_is_refused(pair, tmp_path):
    target, _ = pair
    other = qwen_gguf(tmp_path / "other.gguf", DRAFT_MIX, 1, tokenizer="zyxwvutsrq")
    assert other.config.vocab_size == target.config.vocab_size
    with pytest.raises(ValueError, match="tokenizer differs from the target's"):
        longspec.generate(target, [5, 6, 7], max_new_tokens=4, method="draft", draft_model=other)

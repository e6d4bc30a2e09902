"""A target and a draft model as GGUF files of the Qwen2 family (the 1.5B and 0.5B pair in
small): sharing a tokenizer, `draft` and `triforce` write exactly what plain decoding writes,
the draft over its whole vocabulary or part of it (the target's file loaded again as the draft,
so that drafts are accepted), and so does `auto` with the draft model's
chains among its sources; a draft with another vocabulary, or another tokenizer of the same
size, is refused."""

import pytest
import torch
from gguf_writer import write_gguf
from helpers import assert_matches_ar, make_checkpoint

import longspec
from longspec.cache import StaticCache
from longspec.drafters.auto import DRAFT_MODEL_BUDGET
from longspec.drafters.chain import ChainModel
from longspec.models.compiled import int4_mm
from longspec.models.linear import HeadPart, Int4Linear

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


@pytest.fixture(scope="module")
def twin(pair):
    """The target's file loaded again: a draft model that guesses the target's tokens, so that
    its drafts are accepted and the equality checks them (of the pair's draft's 320 greedy
    drafts over 40 tokens, none was accepted; nor of the target's weights in the draft's mix)."""
    target, _ = pair
    return longspec.load_model(target.path, device="cpu")


@pytest.mark.parametrize("method", ["draft", "triforce"])
@pytest.mark.parametrize("sampling", [longspec.SamplingConfig(temperature=0),
                                      longspec.SamplingConfig(temperature=0.8, top_p=0.9)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("draft_vocab", [0, 160], ids=["whole_vocab", "first_160"])
def test_a_draft_model_of_the_same_family_writes_what_ar_writes(pair, twin, method, sampling,
                                                                draft_vocab):
    target, _ = pair
    assert target.weight_format == twin.weight_format == "int4"
    # fixed sizing: a draft step costs a target step here (the same shapes), so adaptive sizing
    # would rightly draft nothing and leave nothing to check
    res = assert_matches_ar(target, [5, 6, 7, 8, 9, 10], method, 40, sampling=sampling, seed=3,
                            draft_model=twin,
                            options={"draft_vocab": draft_vocab, "sizing": "fixed"})
    assert res.stats["method"] == method and res.stats["accepted_draft_tokens"] > 0


@pytest.mark.parametrize("sampling", [longspec.SamplingConfig(temperature=0),
                                      longspec.SamplingConfig(temperature=0.8, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_auto_drafts_with_a_draft_model_too_and_writes_what_ar_writes(pair, sampling,
                                                                       costs_that_pay):
    target, draft = pair
    res = assert_matches_ar(target, [5, 6, 7, 8, 9, 10], "auto", 40, sampling=sampling, seed=3,
                            draft_model=draft)
    assert res.stats["sources"]["draft_model"]["verified"] > 0
    assert res.stats["accepted_draft_tokens"] > 0       # from its other sources


def test_autos_draft_model_chains_are_the_text_when_the_draft_is_the_target(tmp_path,
                                                                          costs_that_pay):
    # a model of its own: no earlier outputs for the suffix matches to draft from
    target = qwen_gguf(tmp_path / "target.gguf", TARGET_MIX, 0)
    sampling = longspec.SamplingConfig(temperature=0.8, top_p=0.9)
    res = assert_matches_ar(target, [5, 6, 7, 8, 9, 10], "auto", 64, sampling=sampling, seed=3,
                            draft_model=target)
    drafted = res.stats["sources"]["draft_model"]
    assert drafted["accepted"] > 0
    # every draft is the text but those of a last chain cut short by max_new_tokens
    assert drafted["verified"] - drafted["accepted"] <= DRAFT_MODEL_BUDGET.chain


@pytest.mark.compiled("int4_mm")      # a draft vocabulary takes longspec::int4_mm's tiles
def test_a_head_over_part_of_the_vocabulary_gives_its_logits_bitwise_and_no_others():
    head = Int4Linear(torch.randint(0, 16, (320, 64)), torch.rand(320, 2) / 8,
                      -torch.rand(320, 2), doubled=False, bias=torch.randn(320))
    assert head.int4_mm
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    whole = head(x)
    part = HeadPart.over(head, 170)              # the first 160, then blocks as they come
    for tokens, shown in [([], range(160)), ([300, 5, 301], [*range(160), *range(288, 304)]),
                          ([170], [*range(176), *range(288, 304)])]:
        part.add(tokens)
        out = part(x)
        shown = torch.tensor(shown)
        hidden = torch.ones(320, dtype=torch.bool).index_fill_(0, shown, False)
        assert torch.equal(out[:, shown], whole[:, shown])
        assert torch.isneginf(out[:, hidden]).all()


def test_a_draft_over_part_of_its_vocabulary_drafts_from_the_sequences_blocks_too(pair):
    _, draft = pair
    chains = [ChainModel(draft.net, StaticCache(draft.config, 64, draft.dtype, draft.device),
                         vocab=vocab) for vocab in (0, 170)]
    whole, part = (chain.feed([5, 300, 7, 8], last_logits=2) for chain in chains)
    assert whole.shape == part.shape == (2, 320)
    if not int4_mm():       # ATen's int4 layout keeps no tiles: the whole vocabulary
        assert chains[1].head is None and torch.equal(part, whole)
        return
    shown = [*range(160), *range(288, 304)]
    assert torch.equal(part[:, shown], whole[:, shown])
    assert torch.isneginf(part).sum() == 2 * (320 - len(shown))
    assert not torch.isneginf(whole).any()


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

"""Every method writes exactly the tokens plain decoding writes: same seed, same settings,
greedy and sampled, with and without the penalty, on the demo model, dense and quantized. The
slow tier: 1K new tokens in float32 (greedy and sampled, both with the penalty) and 512 in
bfloat16 and with int4 weights (greedy and top-p, without it), so that every setting runs long
in one dtype; the fast tier: 128 tokens of the penalty settings in float32 and a sampled one in
bfloat16 and int4, on another prompt. Exactness in bfloat16 rests on the batch-invariant
forward (test_batch_invariance.py); int4 is the demo model quantized group-wise (`--quantize
q4`), the path a GGUF file takes: its products on the int4 kernel, its layers compiled where a
compiler is. CI runs this file under every kernel profile it can emulate (.ci/run)."""

import functools
from pathlib import Path

import pytest
import tqdm
from helpers import DEVICE

import longspec
from longspec.bench.prompts import default_prompt_text

S = longspec.SamplingConfig
SETTINGS = {
    "greedy": S(temperature=0),
    "greedy_penalty": S(temperature=0, penalty=1.2, penalty_window=64),
    "sampling_min_p_penalty": S(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64),
    "sampling_top_p": S(temperature=0.8, top_p=0.9),
}
NEW_TOKENS = 1024
BF16_NEW_TOKENS = 512
# small retrieval and partial caches, so that they select and rank within these short runs;
# scored trees at a fixed size, so that drafts are verified whatever the sizer would choose
# ("auto" and "draft" keep adaptive sizing, as the defaults they are, under step costs that do
# not depend on the machine (conftest.costs_that_pay), and auto with its gate off so that it
# drafts every step: measured against plain steps, drafting may lose and leave nothing to
# check; `auto[fixed]` and the others keep the gate)
FIXED = {"sizing": "fixed"}
# the draft model's head over half the vocabulary and the text's blocks (with int4 weights)
OPTIONS = {"selfspec": {"retrieval_budget": 128, "rebuild_every": 64},
           "draft": {"draft_vocab": 4096},
           "triforce": {"retrieval_budget": 128, "rebuild_every": 64, "streaming_window": 64,
                        "draft_vocab": 4096},
           "tokenswift": {"partial_budget": 96, **FIXED}, "suffix": FIXED, "ngram": FIXED,
           "recycling": FIXED, "heads": FIXED, "eagle": FIXED, "auto": {"gate": "off"},
           "auto[fixed]": FIXED, "auto[eagle]": FIXED, "auto[draft]": FIXED}
# `auto[draft]`: `auto` with the draft model's chains among its sources
METHODS = ["auto", "auto[fixed]", "auto[eagle]", "auto[draft]", "suffix", "pld", "ngram",
           "recycling", "heads", "tokenswift", "eagle", "draft", "selfspec", "triforce"]
pytestmark = pytest.mark.usefixtures("costs_that_pay")


def prompts():
    held_out = Path(tqdm.__file__).with_name("std.py").read_text()
    return {"tqdm": held_out[:1200], "transformers": default_prompt_text()[20000:21200]}


@functools.cache
def models(dtype: str = "float32"):
    """(target, draft) in `dtype`, or with int4 weights and bfloat16 activations ('int4': the
    CPU's kernels; on CUDA quantized weights run dense)."""
    if dtype == "int4" and DEVICE != "cpu":
        pytest.skip("int4 weights run on the CPU's kernels")
    load = ({"quantize": "q4", "dtype": "bfloat16"} if dtype == "int4" else {"dtype": dtype})
    return (longspec.load_model("demo", device=DEVICE, **load),
            longspec.load_model("demo-draft", device=DEVICE, **load))


@functools.cache
def reference(prompt: str, setting: str, new_tokens: int = NEW_TOKENS,
              dtype: str = "float32") -> tuple[int, ...]:
    target, _ = models(dtype)
    res = longspec.generate(target, prompts()[prompt], max_new_tokens=new_tokens, method="ar",
                            sampling=SETTINGS[setting], seed=3, ignore_eos=True)
    return tuple(res.token_ids)


@pytest.fixture
def drafter(request, method):
    """The trained drafter a method needs that is not bundled with the demo model (and the
    EAGLE drafter `auto` takes in its `auto[eagle]` entry)."""
    return request.getfixturevalue("demo_eagle") if method in ("eagle", "auto[eagle]") else None


def check_matches_ar(entry: str, setting: str, prompt: str, new_tokens: int,
                     dtype: str = "float32", drafter=None) -> None:
    target, draft = models(dtype)
    method = entry.split("[")[0]
    res = longspec.generate(target, prompts()[prompt], max_new_tokens=new_tokens, method=method,
                            sampling=SETTINGS[setting], seed=3, ignore_eos=True,
                            draft_model=(draft if longspec.METHODS[method].needs_draft_model
                                         or entry == "auto[draft]" else None),
                            heads=drafter, options=OPTIONS.get(entry))
    expect = reference(prompt, setting, new_tokens, dtype)
    got = tuple(res.token_ids)
    first_difference = next((i for i, (a, b) in enumerate(zip(got, expect)) if a != b), None)
    assert first_difference is None and len(got) == len(expect) == new_tokens
    assert res.stats["accepted_draft_tokens"] > 0       # the drafts were checked, and used


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["greedy_penalty", "sampling_min_p_penalty"])
@pytest.mark.parametrize("method", METHODS)
def test_method_matches_ar_token_for_token(method, setting, drafter):
    check_matches_ar(method, setting, "transformers", NEW_TOKENS, drafter=drafter)


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["greedy", "sampling_top_p"])
@pytest.mark.parametrize("method", METHODS)
def test_method_matches_ar_token_for_token_in_bfloat16(method, setting, drafter):
    check_matches_ar(method, setting, "transformers", BF16_NEW_TOKENS, "bfloat16", drafter)


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["greedy", "sampling_top_p"])
@pytest.mark.parametrize("method", METHODS)
def test_method_matches_ar_token_for_token_with_int4_weights(method, setting, drafter):
    check_matches_ar(method, setting, "transformers", BF16_NEW_TOKENS, "int4", drafter)


@pytest.mark.parametrize("setting", ["greedy_penalty", "sampling_min_p_penalty"])
@pytest.mark.parametrize("method", METHODS)
def test_method_matches_ar_for_128_tokens(method, setting, drafter):
    check_matches_ar(method, setting, "tqdm", 128, drafter=drafter)


@pytest.mark.parametrize("dtype", ["bfloat16", "int4"])
@pytest.mark.parametrize("method", METHODS)
def test_method_matches_ar_for_128_tokens_in_bfloat16(method, dtype, drafter):
    check_matches_ar(method, "sampling_min_p_penalty", "tqdm", 128, dtype, drafter)


@pytest.mark.slow
def test_tokenswift_drafting_from_the_verify_pass_matches_ar():
    target, _ = models()
    setting = "sampling_min_p_penalty"
    res = longspec.generate(target, prompts()["transformers"], max_new_tokens=NEW_TOKENS,
                            method="tokenswift", sampling=SETTINGS[setting], seed=3,
                            ignore_eos=True, options={"draft_pass": "verify"})
    assert tuple(res.token_ids) == reference("transformers", setting)

"""Every method writes exactly the tokens plain decoding writes: same seed, same settings, greedy
and sampled, with and without the penalty, on the demo model, in float32, bfloat16 and with int4
weights (the demo model quantized group-wise, `--quantize q4`: the path a GGUF file takes, its
products on the int4 kernel, its layers compiled where a compiler is). Exactness in bfloat16 rests
on the batch-invariant forward (test_batch_invariance.py).

Each case is the smallest that reaches its code: 64 new tokens, with caches, rebuilds and the
penalty's window made small enough (OPTIONS, SETTINGS) that the partial cache ranks again, the
retrieval cache is rebuilt and tokens slide out of the window several times within the run. The fast
tier runs float32 and int4 weights sampled with the penalty; the slow tier the rest, and a run of
320 tokens for the methods whose state grows with the text. The cases marked `profiles` (every
method with int4 weights, each dtype with `auto` and `triforce`) run again under each lesser kernel
profile CI can act as (.ci/run)."""

import functools
from pathlib import Path

import pytest
import tqdm
from helpers import DEVICE

import longspec
from longspec.bench.prompts import default_prompt_text
from longspec.request import encode_prompt

S = longspec.SamplingConfig
SETTINGS = {
    "greedy": S(temperature=0),
    "greedy_penalty": S(temperature=0, penalty=1.2, penalty_window=16),
    "sampling_min_p_penalty": S(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=16),
    "sampling_top_p": S(temperature=0.8, top_p=0.9),
}
NEW_TOKENS = 64
LONG_NEW_TOKENS = 320
# small retrieval and partial caches, rebuilt and ranked again every 16-24 tokens, so that they
# select and rank within these short runs;
# scored trees at a fixed size, so that drafts are verified whatever the sizer would choose
# ("auto" and "draft" keep adaptive sizing, as the defaults they are, under step costs that do
# not depend on the machine (conftest.costs_that_pay), and auto with its gate off so that it
# drafts every step: measured against plain steps, drafting may lose and leave nothing to
# check; `auto[fixed]` and the others keep the gate)
FIXED = {"sizing": "fixed"}
# the draft model's head over half the vocabulary and the text's blocks (with int4 weights)
OPTIONS = {"selfspec": {"retrieval_budget": 64, "rebuild_every": 16},
           "draft": {"draft_vocab": 4096},
           "triforce": {"retrieval_budget": 64, "rebuild_every": 16, "streaming_window": 32,
                        "draft_vocab": 4096},
           "tokenswift": {"partial_budget": 40, **FIXED}, "suffix": FIXED, "ngram": FIXED,
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


# every method in each dtype, greedy and sampled (float32 and int4 weights with the penalty,
# bfloat16 without it and with top-p); which of them the fast tier runs; the cross-section CI
# runs under each lesser profile
DTYPES = {"float32": ("greedy_penalty", "sampling_min_p_penalty"),
          "int4": ("greedy_penalty", "sampling_min_p_penalty"),
          "bfloat16": ("greedy", "sampling_top_p")}
FAST = {("float32", "sampling_min_p_penalty"), ("int4", "sampling_min_p_penalty")}
ACROSS_PROFILES = {("int4", "sampling_min_p_penalty"): METHODS,
                   ("float32", "greedy_penalty"): ("auto", "triforce"),
                   ("bfloat16", "sampling_top_p"): ("auto", "triforce")}
# the methods whose tables and caches grow with the text: a longer run each, in the slow tier
GROWING = ("auto", "suffix", "ngram", "recycling", "tokenswift", "selfspec", "triforce")


def matrix():
    for dtype, settings in DTYPES.items():
        for setting in settings:
            for method in METHODS:
                marks = [] if (dtype, setting) in FAST else [pytest.mark.slow]
                if method in ACROSS_PROFILES.get((dtype, setting), ()):
                    marks.append(pytest.mark.profiles)
                yield pytest.param(method, dtype, setting, marks=marks,
                                   id=f"{method}-{dtype}-{setting}")


@pytest.mark.parametrize("method,dtype,setting", matrix())
def test_method_matches_ar_token_for_token(method, dtype, setting, drafter):
    check_matches_ar(method, setting, "tqdm", NEW_TOKENS, dtype, drafter)


@pytest.mark.slow
@pytest.mark.parametrize("method", GROWING)
def test_method_matches_ar_over_a_longer_run(method, drafter):
    check_matches_ar(method, "sampling_min_p_penalty", "transformers", LONG_NEW_TOKENS,
                     drafter=drafter)


@pytest.mark.slow
def test_tokenswift_drafting_from_the_verify_pass_matches_ar():
    target, _ = models()
    setting = "sampling_min_p_penalty"
    res = longspec.generate(target, prompts()["transformers"], max_new_tokens=LONG_NEW_TOKENS,
                            method="tokenswift", sampling=SETTINGS[setting], seed=3,
                            ignore_eos=True, options={"draft_pass": "verify"})
    assert tuple(res.token_ids) == reference("transformers", setting, LONG_NEW_TOKENS)


@pytest.mark.parametrize("method", [pytest.param(m, marks=[] if m == "auto" else [pytest.mark.slow])
                                    for m in METHODS])
def test_an_early_first_token_keeps_plain_decodings_tokens(method, drafter):
    """early_first_token: a drafter that can skip a step (`plain_steps`) has its first step
    verify the prompt's last token alone, one token; every method's tokens stay `ar`'s."""
    target, draft = models()
    name = method.split("[")[0]
    s = longspec.stream(target, prompts()["tqdm"], max_new_tokens=NEW_TOKENS, method=name,
                        sampling=SETTINGS["sampling_min_p_penalty"], seed=3, ignore_eos=True,
                        draft_model=(draft if longspec.METHODS[name].needs_draft_model
                                     or method == "auto[draft]" else None),
                        heads=drafter, options=OPTIONS.get(method), early_first_token=True)
    chunks = [chunk.token_ids for chunk in s]
    assert [t for ids in chunks for t in ids] == list(reference("tqdm", "sampling_min_p_penalty"))
    if s.engine.drafter.plain_steps:
        assert len(chunks[0]) == 1


def test_an_early_first_token_is_a_step_of_one_row():
    """`auto` drafting every step at a fixed size verifies a tree in its first step; asked for
    an early first token, the prompt's last token alone, and trees from the next step on."""
    target, _ = models()

    def rows(early: bool) -> tuple[int, int]:
        s = longspec.stream(target, prompts()["tqdm"], max_new_tokens=8, method="auto",
                            sampling=SETTINGS["greedy_penalty"], seed=3, ignore_eos=True,
                            options={**FIXED, "gate": "off"}, early_first_token=early)
        steps = iter(s)
        next(steps)
        first = s.engine.stats.verified_nodes
        next(steps)
        second = s.engine.stats.verified_nodes - first
        s.close()
        return first, second

    (late, _), (early, after) = rows(False), rows(True)
    assert late > 1 and early == 1 and after > 1


@pytest.mark.parametrize(("method", "early"), [("ar", False), ("auto", True), ("auto", False)])
def test_a_plain_first_step_is_taken_from_the_prefill(monkeypatch, method, early):
    """Where the first step verifies the prompt's last token alone (plain decoding; a plain
    first step asked for), that token goes through the prefill and the first token comes with
    no forward of its own (Engine._first_step_in_prefill); where it drafts, it has its own."""
    target, _ = models()
    prompt = encode_prompt(target, prompts()["tqdm"][:300])
    rows = []
    forward = target.net.forward

    def counted(tokens, *args, **kwargs):
        rows.append(len(tokens))
        return forward(tokens, *args, **kwargs)

    monkeypatch.setattr(target.net, "forward", counted)
    target.state.prompt_cache.clear()
    s = longspec.stream(target, prompt, max_new_tokens=8, method=method, ignore_eos=True,
                        options={**FIXED, "gate": "off"} if method == "auto" else None,
                        sampling=SETTINGS["greedy_penalty"], early_first_token=early)
    first = next(iter(s))
    s.close()
    assert first.token_ids
    if method == "ar" or early:
        assert rows == [len(prompt)]        # one chunk of the prompt, its last token included
    else:
        assert rows[0] == len(prompt) - 1 and len(rows) == 2     # then the step's tree

"""OpenAI's per-token fields under speculation: logprobs (the distribution each token was chosen
from) are the same numbers for every method; logit_bias, the frequency and presence penalties
(over the output so far, each tree node's own path counted) and min_new_tokens (vLLM's
min_tokens: no ending token chosen before it) leave every method's tokens those of plain
decoding, alone and in a batch."""

import functools

import pytest
from test_lossless import OPTIONS, models

import longspec
from longspec.many import run_streams

pytestmark = pytest.mark.usefixtures("costs_that_pay")

S = longspec.SamplingConfig
SAMPLINGS = {
    "greedy": S(temperature=0, frequency_penalty=0.8, presence_penalty=0.4),
    "sampled": S(temperature=0.9, top_p=0.95, frequency_penalty=0.5, presence_penalty=-0.3),
}
BIAS = {"29": -100, 300: 4.5, 1000: -2}
PROMPT = "def parse(text):"
METHODS = ["auto", "suffix", "pld", "recycling", "tokenswift", "draft", "triforce"]


def run(method: str, sampling: str, **extra):
    target, draft = models()
    return longspec.generate(target, PROMPT, max_new_tokens=48, method=method,
                             sampling=SAMPLINGS[sampling], seed=4, ignore_eos=True,
                             logit_bias=BIAS, logprobs=3, options=OPTIONS.get(method),
                             draft_model=draft if method in ("draft", "triforce") else None,
                             **extra)


@functools.cache
def plain(sampling: str) -> longspec.GenerationResult:
    return run("ar", sampling)


@pytest.mark.parametrize("sampling", [pytest.param("greedy", marks=pytest.mark.slow),
                                      "sampled"])
@pytest.mark.parametrize("method", METHODS)
def test_logprobs_bias_and_penalties_match_ar(method, sampling):
    expect, got = plain(sampling), run(method, sampling)
    assert got.token_ids == expect.token_ids
    assert got.logprobs == expect.logprobs
    assert got.stats["drafted_tokens"] > 0         # drafts were verified


def test_logprobs_name_each_token_and_its_likeliest_alternatives():
    res = run("auto", "greedy")
    assert [lp["token"] for lp in res.logprobs] == res.token_ids
    for lp in res.logprobs:
        assert len(lp["top"]) == 3 and lp["top"][0][1] >= lp["logprob"]
        assert lp["top"][0][0] == lp["token"]           # greedy: the likeliest token
    assert 29 not in res.token_ids                     # biased away


def test_the_penalties_count_the_output_only():
    """A prompt's tokens do not count: with the prompt's tokens barred by a huge presence
    penalty the output could not start as the prompt does; it does, as without penalties."""
    target, _ = models()
    ids = target.tokenizer(PROMPT)["input_ids"]
    free = longspec.generate(target, ids + ids, max_new_tokens=len(ids),
                             sampling=S(temperature=0), method="ar", ignore_eos=True)
    penalized = longspec.generate(target, ids + ids, max_new_tokens=len(ids), method="ar",
                                  sampling=S(temperature=0, presence_penalty=2),
                                  ignore_eos=True)
    assert penalized.token_ids[0] == free.token_ids[0]


@pytest.mark.parametrize("together", [False, True])
def test_in_a_batch_each_member_matches_ar_alone(together, monkeypatch):
    monkeypatch.setattr("longspec.engine.batching.samples_together", lambda device: together)
    target, _ = models()
    biases = [BIAS, None, {"300": -100}]
    alone = [longspec.generate(target, PROMPT, max_new_tokens=48, method="ar",
                               sampling=SAMPLINGS["sampled"], seed=4 + i, logit_bias=b,
                               logprobs=2) for i, b in enumerate(biases)]
    streams = [longspec.api.stream_request(target, longspec.Request(
        PROMPT, max_new_tokens=48, method="auto", sampling=SAMPLINGS["sampled"], seed=4 + i,
        logit_bias=b, logprobs=2)) for i, b in enumerate(biases)]
    for _ in run_streams(target, streams, 3):
        pass
    assert [s.result.token_ids for s in streams] == [r.token_ids for r in alone]
    assert [s.result.logprobs for s in streams] == [r.logprobs for r in alone]


@functools.cache
def early_stop() -> tuple[int, list[int]]:
    """A stop token id that plain decoding writes among its first tokens, and ar's output held
    to 12 new tokens before any end."""
    target, _ = models()
    free = longspec.generate(target, PROMPT, max_new_tokens=24, method="ar",
                             sampling=SAMPLINGS["sampled"], seed=4)
    token = free.token_ids[2]
    held = longspec.generate(target, PROMPT, max_new_tokens=24, method="ar", stop=[token],
                             sampling=SAMPLINGS["sampled"], seed=4, min_new_tokens=12)
    return token, held.token_ids


@pytest.mark.parametrize("method", [m if m in ("auto", "pld") else
                                    pytest.param(m, marks=pytest.mark.slow) for m in METHODS])
def test_min_new_tokens_holds_back_every_end_and_matches_ar(method):
    target, draft = models()
    token, expect = early_stop()
    assert len(expect) >= 12 and token not in expect[:12]
    got = longspec.generate(target, PROMPT, max_new_tokens=24, method=method, stop=[token],
                            sampling=SAMPLINGS["sampled"], seed=4, min_new_tokens=12,
                            options=OPTIONS.get(method),
                            draft_model=draft if method in ("draft", "triforce") else None)
    assert got.token_ids == expect


def test_min_new_tokens_holds_back_stop_strings():
    target, _ = models()
    free = longspec.generate(target, PROMPT, max_new_tokens=24, method="ar",
                             sampling=SAMPLINGS["sampled"], seed=4, ignore_eos=True)
    first = target.tokenizer.decode(free.token_ids[:2])
    stopped = longspec.generate(target, PROMPT, max_new_tokens=24, method="auto", stop=first,
                                sampling=SAMPLINGS["sampled"], seed=4, ignore_eos=True,
                                min_new_tokens=10)
    assert len(stopped.token_ids) >= 10


@pytest.mark.parametrize("settings,message", [
    ({"min_new_tokens": 5}, "min_new_tokens must be in 0 .. max_new_tokens"),
    ({"min_new_tokens": 2, "regex": "a+"}, "min_new_tokens does not apply"),
    ({"logit_bias": {"x": 1}}, "token ids"),
    ({"logit_bias": {5: 101}}, "[-100, 100]"),
    ({"logit_bias": {10**9: 1}}, "outside the vocabulary"),
    ({"logprobs": 21}, "logprobs must be 0 .. 20"),
    ({"sampling": S(frequency_penalty=3)}, "frequency_penalty must be in [-2, 2]"),
])
def test_bad_fields_are_refused(settings, message):
    target, _ = models()
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        longspec.generate(target, PROMPT, max_new_tokens=4, **settings)

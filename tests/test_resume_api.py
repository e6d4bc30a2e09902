"""`resume_from=`: continuing after tokens an interrupted run committed gives exactly the
uninterrupted run, greedy or sampled, plain or speculative, through stop rules."""

import pytest
from helpers import make_checkpoint

import longspec

PROMPT = [3, 4, 5, 3, 4, 5, 6]
SETTINGS = {
    "greedy": longspec.SamplingConfig(temperature=0),
    "sampled-penalty": longspec.SamplingConfig(temperature=1.0, top_p=0.9, penalty=1.3,
                                               penalty_window=16),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("resume")
    make_checkpoint(path, "qwen2", max_positions=256)
    return longspec.load_model(path, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def demo():
    return longspec.load_model("demo", dtype="float32", device="cpu")


@pytest.mark.parametrize("method", ["ar", "pld"])
@pytest.mark.parametrize("sampling", list(SETTINGS))
def test_resume_from_any_point_equals_the_uninterrupted_run(model, method, sampling):
    kwargs = {"max_new_tokens": 48, "method": method, "sampling": SETTINGS[sampling], "seed": 7,
              "ignore_eos": True}
    ref = longspec.generate(model, PROMPT, **kwargs)
    for k in (0, 1, 5, 23, 47):
        res = longspec.generate(model, PROMPT, resume_from=ref.token_ids[:k], **kwargs)
        assert res.token_ids == ref.token_ids, k
        assert res.finish_reason == "length" and res.prompt_tokens == len(PROMPT)
        assert res.stats["new_tokens"] == 48 - k and res.stats["resumed_tokens"] == k


def test_resuming_a_finished_run_runs_nothing_and_returns_it(model):
    kwargs = {"max_new_tokens": 20, "seed": 1, "ignore_eos": True}
    ref = longspec.generate(model, PROMPT, **kwargs)
    again = longspec.generate(model, PROMPT, resume_from=ref.token_ids, **kwargs)
    assert again.token_ids == ref.token_ids and again.finish_reason == "length"
    assert again.stats["steps"] == 0
    stop = ref.token_ids[9]
    cut = longspec.generate(model, PROMPT, stop=[stop], **kwargs)
    done = longspec.generate(model, PROMPT, stop=[stop], resume_from=cut.token_ids, **kwargs)
    assert done.token_ids == cut.token_ids and done.finish_reason == "stop"


def test_stop_string_across_the_seam_and_the_text_of_the_whole_run(demo):
    greedy = longspec.SamplingConfig(temperature=0)
    full = longspec.generate(demo, "def f(x):\n", max_new_tokens=48, sampling=greedy,
                             ignore_eos=True)
    stop = full.text[20:28]
    kwargs = {"max_new_tokens": 48, "sampling": greedy, "stop": [stop], "ignore_eos": True,
              "method": "recycling"}
    ref = longspec.generate(demo, "def f(x):\n", **kwargs)
    assert ref.finish_reason == "stop"
    for k in range(max(0, len(ref.token_ids) - 4), len(ref.token_ids) + 1):
        s = longspec.stream(demo, "def f(x):\n", resume_from=ref.token_ids[:k], **kwargs)
        streamed = s.resumed_text + "".join(c.text for c in s)
        assert s.result.token_ids == ref.token_ids and s.result.text == ref.text == streamed


@pytest.mark.parametrize("resume_from,error,match", [
    ([1, 2, "x"], TypeError, "resume_from must be a list of token ids"),
    ("12", TypeError, "resume_from must be a list of token ids"),
    ([1, 10_000], ValueError, "outside the vocabulary"),
    (list(range(1, 30)), ValueError, "more than max_new_tokens"),
])
def test_bad_resume_from_is_refused(model, resume_from, error, match):
    with pytest.raises(error, match=match):
        longspec.generate(model, PROMPT, max_new_tokens=20, resume_from=resume_from)


def test_resume_from_past_a_stop_or_with_rejection_is_refused(model):
    ref = longspec.generate(model, PROMPT, max_new_tokens=20, ignore_eos=True)
    with pytest.raises(ValueError, match="a stop rule fires there"):
        longspec.generate(model, PROMPT, max_new_tokens=20, ignore_eos=True,
                          stop=[ref.token_ids[3]], resume_from=ref.token_ids[:10])
    draft = longspec.load_model(model.path, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="verify='match'"):
        longspec.generate(model, PROMPT, max_new_tokens=20, method="draft", draft_model=draft,
                          verify="rejection", resume_from=ref.token_ids[:3])

"""The public API on a tiny checkpoint: stream equals generate, early close keeps the text;
a model's step costs outlive its process."""

import time

import pytest
from helpers import make_checkpoint

import longspec
from longspec.models.loader import STEP_COSTS_FILE


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("api")
    make_checkpoint(path, "qwen2", max_positions=256)
    return longspec.load_model(path, dtype="float32", device="cpu")


def test_stream_chunks_add_up_to_generate(model):
    kwargs = {"max_new_tokens": 40, "method": "pld", "seed": 5, "ignore_eos": True,
              "sampling": longspec.SamplingConfig(temperature=0.7)}
    whole = longspec.generate(model, [3, 4, 5, 3, 4], **kwargs)
    s = longspec.stream(model, [3, 4, 5, 3, 4], **kwargs)
    chunks = [c.token_ids for c in s]
    assert [t for c in chunks for t in c] == whole.token_ids
    assert s.result.token_ids == whole.token_ids and s.result.stats["new_tokens"] == 40


def test_closing_a_stream_early_keeps_what_was_committed(model):
    s = longspec.stream(model, [1, 2, 3], max_new_tokens=50, ignore_eos=True)
    it = iter(s)
    first = next(it).token_ids + next(it).token_ids
    s.close()
    assert s.result.token_ids == first and s.result.stats["new_tokens"] == len(first)


def test_decode_time_leaves_out_the_callers_time_with_each_chunk(model):
    """A streamed run is timed as a collected one: the time the caller spends with a chunk
    (writing it out) is not decoding, here nor when the caller closes the stream early."""
    for close_after in (None, 3):
        s = longspec.stream(model, [1, 2, 3], max_new_tokens=8, method="ar", ignore_eos=True)
        begin, held = time.perf_counter(), 0
        for held, _ in enumerate(s, start=1):
            time.sleep(0.05)
            if held == close_after:
                s.close()
        assert s.result.stats["decode_s"] <= time.perf_counter() - begin - 0.05 * held


def test_max_new_tokens_none_is_the_rest_of_the_context(tmp_path):
    make_checkpoint(tmp_path, "qwen2", max_positions=40)
    short = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    res = longspec.generate(short, [1, 2, 3, 4], max_new_tokens=None, ignore_eos=True)
    assert len(res.token_ids) == 36 and res.finish_reason == "length"


def test_eos_ends_generation_and_is_kept(model):
    ref = longspec.generate(model, [1, 2, 3], max_new_tokens=30, ignore_eos=True,
                            sampling=longspec.SamplingConfig(temperature=0))
    stop_token = ref.token_ids[7]
    cut = longspec.generate(model, [1, 2, 3], max_new_tokens=30, stop=[stop_token],
                            sampling=longspec.SamplingConfig(temperature=0), method="recycling")
    first = ref.token_ids.index(stop_token)
    assert cut.token_ids == ref.token_ids[:first + 1]


def test_unknown_method_option_is_rejected(model):
    with pytest.raises(ValueError, match="takes no option 'gamma1'"):
        longspec.generate(model, [1, 2], max_new_tokens=2, method="pld", options={"gamma1": 3})
    with pytest.raises(ValueError, match="positive integer"):
        longspec.generate(model, [1, 2], max_new_tokens=2, method="pld", options={"max_depth": 0})
    with pytest.raises(ValueError, match="option gate must be one of measured, off"):
        longspec.generate(model, [1, 2], max_new_tokens=2, method="auto", options={"gate": False})


def test_draft_model_with_another_vocabulary_is_rejected(model, tmp_path):
    make_checkpoint(tmp_path, "llama", vocab=200)
    other = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="vocabulary"):
        longspec.generate(model, [1, 2], max_new_tokens=2, method="draft", draft_model=other)
    with pytest.raises(ValueError, match="needs a draft model"):
        longspec.generate(model, [1, 2], max_new_tokens=2, method="triforce")


def test_selfspec_takes_plain_steps_while_its_retrieval_cache_holds_everything(model):
    # the default retrieval budget (4096) holds this whole context: drafting with it would
    # be the target itself
    res = longspec.generate(model, [3, 4, 5, 3, 4], max_new_tokens=20, method="selfspec",
                            ignore_eos=True, sampling=longspec.SamplingConfig(temperature=0))
    ref = longspec.generate(model, [3, 4, 5, 3, 4], max_new_tokens=20, method="ar",
                            ignore_eos=True, sampling=longspec.SamplingConfig(temperature=0))
    assert res.token_ids == ref.token_ids and res.stats["drafted_tokens"] == 0


def test_draft_model_with_a_shorter_context_is_rejected(model, tmp_path):
    make_checkpoint(tmp_path, "qwen2", max_positions=32)
    short = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="draft model's context"):
        longspec.generate(model, [1, 2], max_new_tokens=60, method="draft", draft_model=short)


def test_two_streams_on_one_model_advanced_in_turn_give_what_each_gives_alone():
    """A generation's state lives with it, not on the shared model: two streams on one
    quantized model (the compiled layers), advanced a step each in turn, write exactly what
    each writes alone."""
    model = longspec.load_model("demo", quantize="q4", device="cpu")
    runs = [("def fibonacci(n):\n", {"method": "auto", "seed": 1}),
            ("import os\nimport sys\n", {"method": "pld", "seed": 2,
                                         "sampling": longspec.SamplingConfig(temperature=0.7)})]
    alone = [longspec.generate(model, prompt, max_new_tokens=48, ignore_eos=True,
                               **kw).token_ids for prompt, kw in runs]
    streams = [iter(longspec.stream(model, prompt, max_new_tokens=48, ignore_eos=True, **kw))
               for prompt, kw in runs]
    written: list[list[int]] = [[], []]
    live = [0, 1]
    while live:
        for i in list(live):
            chunk = next(streams[i], None)
            if chunk is None:
                live.remove(i)
            else:
                written[i] += chunk.token_ids
    assert written == alone


def test_a_loaded_model_keeps_its_step_costs_where_the_next_load_finds_them(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("LONGSPEC_HOME", str(tmp_path))
    model = longspec.load_model("demo")
    longspec.generate(model, "def f(x):", max_new_tokens=24, method="auto", ignore_eos=True)
    assert (tmp_path / STEP_COSTS_FILE).is_file()
    again = longspec.load_model("demo")
    assert again.state.step_costs.fastest(1) == model.state.step_costs.fastest(1) is not None

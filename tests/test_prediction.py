"""Predicted outputs (OpenAI's `prediction`): the output expected, a draft source of `auto` and
`suffix`. Whatever the prediction (the output itself, the output with an edit, unrelated
text), the tokens are `ar`'s; the usage counts the prediction's tokens that appear in the
output and the rest; the methods that do not draft from one refuse it."""

import json
import subprocess
import sys

import pytest

import longspec
from longspec.api import prediction_usage

PROMPT = "def parse(text):\n"
N = 48
# the sizer's step costs as conftest's costs_that_pay gives them, not as timed: what `auto`
# drafts depends on the text alone; trees of at most 16 nodes keep the steps short
pytestmark = pytest.mark.usefixtures("costs_that_pay")
SMALL = {"max_nodes": 16}
GREEDY = {"sampling": longspec.SamplingConfig(temperature=0)}
SAMPLED = {"sampling": longspec.SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2,
                                               penalty_window=64), "seed": 7}


@pytest.fixture(scope="module")
def model():
    return longspec.load_model("demo", dtype="float32")


def edited(text: str) -> str:
    """`text` with a line inserted in its middle and a word dropped near its end."""
    middle = len(text) // 2
    return text[:middle] + "\n    value = compute(value)\n" + text[middle:-40] + text[-30:]


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_every_prediction_gives_ar_s_tokens(model, settings):
    ref = longspec.generate(model, PROMPT, max_new_tokens=N, method="ar", ignore_eos=True,
                            **settings)
    predictions = {"itself": ref.text, "its ids": ref.token_ids, "edited": edited(ref.text),
                   "unrelated": "import os\n\nprint(os.getcwd())\n"}
    for method in ("auto", "suffix"):
        for name, prediction in predictions.items():
            model.state.clear()
            out = longspec.generate(model, PROMPT, max_new_tokens=N, method=method,
                                    ignore_eos=True, prediction=prediction, options=SMALL,
                                    **settings)
            assert out.token_ids == ref.token_ids, (method, name)
            usage = out.stats["prediction"]
            size = usage["accepted_tokens"] + usage["rejected_tokens"]
            if name == "its ids":
                assert usage == {"accepted_tokens": N, "rejected_tokens": 0}
            if name in ("itself", "its ids"):      # text is tokenized again: nearly the ids
                assert usage["accepted_tokens"] >= 0.9 * N
                assert out.stats["mean_accepted_length"] > 3, (method, name)
            assert 0 <= usage["accepted_tokens"] <= N and size > 0


def test_a_prediction_is_drafted_and_accepted_where_the_text_is_new(model):
    """The demo model's answer, predicted: far more tokens a step than without it (at twice
    the equality tests' length, so that the steps the sizer times weigh little)."""
    n = 2 * N
    ref = longspec.generate(model, PROMPT, max_new_tokens=n, method="ar", ignore_eos=True,
                            **GREEDY)
    model.state.clear()
    alone = longspec.generate(model, PROMPT, max_new_tokens=n, ignore_eos=True, options=SMALL,
                              **GREEDY)
    model.state.clear()
    helped = longspec.generate(model, PROMPT, max_new_tokens=n, ignore_eos=True,
                               prediction=edited(ref.text), options=SMALL, **GREEDY)
    assert helped.token_ids == alone.token_ids == ref.token_ids
    sources = helped.stats["sources"]["prediction"]
    assert sources["accepted"] > n / 2
    # (less the steps that timed a size: the same few in both, whatever the prediction)
    steps = {name: res.stats["steps"] - res.stats["timing_steps"]
             for name, res in (("helped", helped), ("alone", alone))}
    assert steps["helped"] < steps["alone"] / 2


def test_prediction_usage_counts_what_a_diff_matches():
    assert prediction_usage([1, 2, 3, 4], [1, 2, 9, 3, 4, 5]) == {
        "accepted_tokens": 4, "rejected_tokens": 0}
    assert prediction_usage([1, 2, 3, 4], [1, 9]) == {"accepted_tokens": 1, "rejected_tokens": 3}
    assert prediction_usage([5, 6], []) == {"accepted_tokens": 0, "rejected_tokens": 2}


def test_bad_predictions_are_refused(model):
    with pytest.raises(ValueError, match="method 'heads' drafts nothing from a prediction; "
                       "methods that do: auto, suffix"):
        longspec.generate(model, PROMPT, max_new_tokens=4, method="heads", prediction="x")
    with pytest.raises(TypeError, match="the prediction must be text or a list of token ids"):
        longspec.generate(model, PROMPT, max_new_tokens=4, prediction=5)
    with pytest.raises(ValueError, match="prediction token id 99999 is outside the vocabulary"):
        longspec.generate(model, PROMPT, max_new_tokens=4, prediction=[1, 99999])
    out = longspec.generate(model, PROMPT, max_new_tokens=4, method="ar", prediction="")
    assert "prediction" not in out.stats


@pytest.mark.slow      # keeps the fast tier under five minutes
def test_cli_prediction_file(tmp_path, model):
    ref = longspec.generate(model, PROMPT, max_new_tokens=48, method="ar", ignore_eos=True,
                            **GREEDY)
    path = tmp_path / "expected.py"
    path.write_text(edited(ref.text))
    proc = subprocess.run([sys.executable, "-m", "longspec.cli", "generate", "demo", "--prompt",
                           PROMPT, "--max-new-tokens", "48", "--temperature", "0", "--ignore-eos",
                           "--dtype", "float32", "--prediction-file", str(path), "--json",
                           "--no-progress"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["token_ids"] == ref.token_ids
    assert out["stats"]["prediction"]["accepted_tokens"] > 30

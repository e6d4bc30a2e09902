"""The command line end to end on the bundled demo model."""

import json
import subprocess
import sys

import pytest

import longspec
from longspec.cli import main
from longspec.cli.demo import CHAT_PROMPT

STATS_KEYS = {"new_tokens", "steps", "drafted_tokens", "accepted_draft_tokens", "acceptance_rate",
              "mean_accepted_length", "prefill_s", "decode_s", "tokens_per_s", "peak_memory_bytes",
              "method", "device", "dtype"}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "longspec.cli", *args], capture_output=True,
                          text=True, check=False, timeout=300)


def test_generate_json_on_demo_model():
    proc = run_cli("generate", "demo", "--prompt", "def main():\n", "--max-new-tokens", "24",
                   "--method", "pld", "--temperature", "0", "--json", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["token_ids"]) == 24 and isinstance(out["text"], str)
    assert STATS_KEYS <= set(out["stats"]) and out["stats"]["method"] == "pld"
    model = longspec.load_model("demo", dtype="float32")
    ref = longspec.generate(model, "def main():\n", max_new_tokens=24, ignore_eos=True, method="ar",
                            sampling=longspec.SamplingConfig(temperature=0))
    assert out["token_ids"] == ref.token_ids


def test_generate_streams_text_and_appends_to_output_file(tmp_path, capsys):
    out_file = tmp_path / "out.txt"
    out_file.write_text("earlier\n")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("import os\n")
    code = main(["generate", "demo", "--prompt-file", str(prompt), "--max-new-tokens", "40",
                 "--output", str(out_file), "--seed", "1", "--min-p", "0.1", "--no-progress",
                 "--ignore-eos"])
    assert code == 0
    printed = capsys.readouterr().out
    assert out_file.read_text() == "earlier\n" + printed.rstrip("\n")
    model = longspec.load_model("demo")
    ref = longspec.generate(model, "import os\n", max_new_tokens=40, seed=1, ignore_eos=True,
                            method="ar",
                            sampling=longspec.SamplingConfig(min_p=0.1))
    assert printed.rstrip("\n") == ref.text


def test_progress_bar_goes_to_stderr(capsys):
    assert main(["generate", "demo", "--prompt", "x = 1\n", "--max-new-tokens", "8", "--method",
                 "recycling", "--ignore-eos"]) == 0
    captured = capsys.readouterr()
    assert "tok" in captured.err and "8/8" in captured.err


def test_demo_command_prints_a_summary_line(capsys):
    assert main(["demo", "--model", "demo", "--max-new-tokens", "48"]) == 0
    out = capsys.readouterr().out
    assert "[longspec demo] 48 tokens" in out and "tokens/s" in out and "x its speed" in out
    assert "plain decoding wrote 48 tokens" in out and "the tokens are identical" in out
    assert "Kernel profile: cpu" in out


@pytest.mark.network
@pytest.mark.slow
def test_demo_on_smollm2_exits_0_with_an_answer_that_does_not_loop(capsys):
    try:
        longspec.fetch_model("smollm2")
    except ValueError as e:
        pytest.skip(f"no network: {e}")
    assert main(["demo"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    answer = out[out.index(CHAT_PROMPT) + len(CHAT_PROMPT):out.index("[longspec demo]")]
    words = answer.split()
    grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
    assert len(words) > 100 and len(set(grams)) / len(grams) > 0.8
    assert "the tokens are identical" in out
    assert "generate:" not in captured.err      # the streamed text is the progress


def test_fetch_command_prints_where_the_model_is(tmp_path, monkeypatch, capsys):
    target = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    target.parent.mkdir()
    target.write_bytes(b"GGUF")                  # already fetched: nothing is downloaded
    monkeypatch.setenv("LONGSPEC_HOME", str(tmp_path))
    assert main(["fetch", "smollm2"]) == 0
    assert capsys.readouterr().out.strip() == str(target)


def test_stop_string_ends_generation_in_new_text_only():
    model = longspec.load_model("demo", dtype="float32")
    sampling = longspec.SamplingConfig(temperature=0)
    full = longspec.generate(model, "def f(x):\n", max_new_tokens=64, sampling=sampling,
                             ignore_eos=True)
    stop = full.text[10:14]
    kwargs = {"max_new_tokens": 64, "sampling": sampling, "stop": [stop], "method": "recycling",
              "ignore_eos": True}
    cut = longspec.generate(model, "def f(x):\n", **kwargs)
    # the text ends before the stop string; the token ids run through the token completing it
    assert cut.finish_reason == "stop" and cut.text == full.text[:10]
    assert full.token_ids[:len(cut.token_ids)] == cut.token_ids
    kept = longspec.generate(model, "def f(x):\n", include_stop=True, **kwargs)
    assert kept.token_ids == cut.token_ids and kept.text.startswith(full.text[:14])
    # the prompt contains "def": a stop string seen only in the prompt does not stop anything
    again = longspec.generate(model, "def f(x):\n", max_new_tokens=16, sampling=sampling,
                              stop=["def f"], ignore_eos=True)
    assert len(again.token_ids) == 16 or again.finish_reason == "stop"

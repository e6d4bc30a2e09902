"""Chat prompts, clean text (special tokens and the stop string left out), finish reasons, and
the CLI's prompt sources, on a copy of the demo model given a chat template."""

import json
import subprocess
import sys

import pytest
from serving import demo_chat
from transformers import AutoTokenizer

import longspec
from longspec.cli import main
from longspec.outputs.text import TextStream, decode

TEMPLATE = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")
GREEDY = longspec.SamplingConfig(temperature=0)
MESSAGES = [{"role": "system", "content": "Write Python."},
            {"role": "user", "content": "A function that parses a date."}]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return demo_chat(tmp_path_factory.mktemp("chat") / "demo-chat", TEMPLATE)


@pytest.fixture(scope="module")
def model(chat_dir):
    return longspec.load_model(chat_dir, dtype="float32", device="cpu")


def test_chat_messages_go_through_the_chat_template(model, chat_dir):
    tok = AutoTokenizer.from_pretrained(chat_dir)
    expect = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                     return_dict=False)
    by_messages = longspec.generate(model, MESSAGES, max_new_tokens=12, sampling=GREEDY,
                                    ignore_eos=True)
    by_ids = longspec.generate(model, expect, max_new_tokens=12, sampling=GREEDY,
                               ignore_eos=True)
    assert by_messages.prompt_tokens == len(expect)
    assert by_messages.token_ids == by_ids.token_ids


def test_special_tokens_are_left_out_of_the_text_unless_kept(model):
    tok = model.tokenizer
    ids = tok("x = 1")["input_ids"] + [tok.eos_token_id] + tok("y = 2")["input_ids"]
    for keep in (False, True):
        stream = TextStream(tok, [], [], keep_special=keep, include_stop=False)
        text = stream.push(ids[:3]) + stream.finish(ids[3:], False)
        assert text == decode(tok, ids, keep) == tok.decode(ids, skip_special_tokens=not keep)
        assert ("<|endoftext|>" in text) == keep
    res = longspec.generate(model, [5, 6, 7], max_new_tokens=20, ignore_eos=True)
    kept = longspec.generate(model, [5, 6, 7], max_new_tokens=20, ignore_eos=True,
                             keep_special=True)
    assert res.token_ids == kept.token_ids
    assert res.text == tok.decode(res.token_ids, skip_special_tokens=True)
    assert kept.text == tok.decode(res.token_ids)


def test_finish_reason_for_each_way_a_run_ends(model):
    ref = longspec.generate(model, "def f(x):\n", max_new_tokens=30, sampling=GREEDY,
                            ignore_eos=True)
    assert ref.finish_reason == "length" and len(ref.token_ids) == 30
    token = ref.token_ids[5]
    by_id = longspec.generate(model, "def f(x):\n", max_new_tokens=30, sampling=GREEDY,
                              stop=[token], ignore_eos=True)
    assert by_id.finish_reason == "stop"
    as_eos = longspec.load_model(longspec.demo_path("demo"), dtype="float32", device="cpu")
    as_eos.generation_eos = (token,)
    by_eos = longspec.generate(as_eos, "def f(x):\n", max_new_tokens=30, sampling=GREEDY)
    assert by_eos.finish_reason == "eos" and by_eos.token_ids == by_id.token_ids
    s = longspec.stream(model, "def f(x):\n", max_new_tokens=30, ignore_eos=True)
    next(iter(s))
    s.close()
    assert s.result.finish_reason == "interrupted"


@pytest.mark.parametrize("method", ["ar", "pld", "recycling"])
def test_streamed_text_adds_up_to_the_result_text_with_a_stop_string(model, method):
    ref = longspec.generate(model, "import os\n", max_new_tokens=60, sampling=GREEDY,
                            ignore_eos=True)
    stop = ref.text[20:26]
    s = longspec.stream(model, "import os\n", max_new_tokens=60, sampling=GREEDY, stop=[stop],
                        method=method, ignore_eos=True)
    streamed = "".join(c.text for c in s)
    assert streamed == s.result.text == ref.text[:ref.text.index(stop)]


@pytest.mark.slow      # keeps the fast tier under five minutes
def test_cli_chat_system_and_prompt_from_stdin(chat_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "longspec.cli", "generate", str(chat_dir), "--prompt-file", "-",
         "--chat", "--system", "Write Python.", "--max-new-tokens", "12", "--temperature", "0",
         "--ignore-eos", "--json", "--dtype", "float32"],
        input="A function that parses a date.", capture_output=True, text=True, timeout=300,
        check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    model = longspec.load_model(chat_dir, dtype="float32")
    ref = longspec.generate(model, MESSAGES, max_new_tokens=12, sampling=GREEDY, ignore_eos=True)
    assert out["token_ids"] == ref.token_ids and out["finish_reason"] == "length"
    assert out["prompt_tokens"] == ref.prompt_tokens


def test_cli_prompt_ids(capsys):
    assert main(["generate", "demo", "--prompt-ids", "5,6,7", "--max-new-tokens", "5",
                 "--temperature", "0", "--ignore-eos", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    model = longspec.load_model("demo")
    ref = longspec.generate(model, [5, 6, 7], max_new_tokens=5, sampling=GREEDY, ignore_eos=True)
    assert out["token_ids"] == ref.token_ids and out["prompt_tokens"] == 3


@pytest.mark.parametrize("argv,match", [
    (["--prompt-ids", "1,x"], "--prompt-ids takes comma-separated integers"),
    (["--prompt-ids", "1,2", "--chat"], "--chat takes --prompt"),
    (["--prompt", "x", "--system", "be brief"], "--system goes with --chat"),
    (["--prompt-file", "DIR"], "is a directory"),
    (["--prompt", "x", "--output", "DIR"], "--output"),
    (["--prompt", "x", "--output", "/nonexistent-dir/out.txt"], "does not exist"),
    (["--prompt", "x", "--method", "pld", "--draft-model", "demo-draft"], "takes no draft model"),
    (["--prompt", "x", "--method", "ar", "--heads", "somewhere"], "takes no heads"),
    (["--prompt", "x", "--method", "pld", "--verify", "rejection"], "does not sample"),
])
def test_cli_bad_prompt_and_flags_fail_before_loading(tmp_path, capsys, argv, match):
    argv = [str(tmp_path) if a == "DIR" else a for a in argv]
    # the model path does not exist: a flag error must come first, before any loading
    assert main(["generate", "/nonexistent/model", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err

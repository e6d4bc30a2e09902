"""`longspec batch`: a line per prompt, each result what `generate` gives for it; killed
anywhere (SIGKILL included) and run again, the same file as an uninterrupted run, nothing
written twice; bad input refused, naming the line, before a model loads."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import longspec
from longspec.cli import main
from longspec.jobs.batch_job import line_sidecar, read_lines, run_job
from longspec.request import Request

LINES = [{"prompt": "def parse(text):\n"},
         {"id": "imports", "prompt": "import os\n", "temperature": 0, "max_new_tokens": 24},
         {"prompt": [12, 40, 7], "seed": 4, "min_p": 0.1, "penalty": 1.2,
          "prediction": "import sys\n"},
         {"prompt": "class Parser:\n", "method": "pld", "top_p": 0.9}]
ARGS = ["demo", "--max-new-tokens", "48", "--ignore-eos", "--seed", "3", "--dtype", "float32",
        "--no-progress"]


@pytest.fixture(scope="module")
def model():
    return longspec.load_model("demo", dtype="float32")


def write_prompts(path, lines=LINES):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def batch(prompts, out, *extra):
    return main(["batch", ARGS[0], str(prompts), "--out", str(out), *ARGS[1:], *extra])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run's file."""
    d = tmp_path_factory.mktemp("batch")
    assert batch(write_prompts(d / "prompts.jsonl"), d / "out.jsonl") == 0
    return (d / "out.jsonl").read_text()


def test_each_line_is_what_generate_writes_for_it(reference, model):
    results = [json.loads(raw) for raw in reference.splitlines()]
    assert [r["id"] for r in results] == ["1", "imports", "3", "4"]
    settings = [{}, {"sampling": longspec.SamplingConfig(temperature=0), "max_new_tokens": 24},
                {"seed": 4, "sampling": longspec.SamplingConfig(min_p=0.1, penalty=1.2),
                 "prediction": "import sys\n"},
                {"method": "pld", "sampling": longspec.SamplingConfig(top_p=0.9)}]
    for line, result, own in zip(LINES, results, settings):
        kwargs = {"max_new_tokens": 48, "seed": 3, "ignore_eos": True, **own}
        ref = longspec.generate(model, line["prompt"], **kwargs)
        assert result["token_ids"] == ref.token_ids and result["text"] == ref.text
        assert result["finish_reason"] == ref.finish_reason == "length"
    assert results[1]["usage"] == {"prompt_tokens": ref_prompt_tokens(model, LINES[1]),
                                   "completion_tokens": 24}
    assert results[2]["usage"]["accepted_prediction_tokens"] >= 0


def ref_prompt_tokens(model, line):
    return len(longspec.request.encode_prompt(model, line["prompt"]))


def sidecars(out) -> list:
    return sorted(out.parent.glob(out.name + ".line*"))


def test_a_finished_job_run_again_writes_nothing(tmp_path, reference):
    out = tmp_path / "out.jsonl"
    out.write_text(reference)
    assert batch(write_prompts(tmp_path / "prompts.jsonl"), out) == 0
    assert out.read_text() == reference and not sidecars(out)


# (--max-batch, the line whose sidecar is watched, the tokens it has when the job is killed):
# inside the third line, which joined the batch as the second ended; and once the line
# "imports" (24 tokens) ended, before the first line, which is written first, has
KILLS = [(2, 3, 10), pytest.param(4, 2, 24, marks=pytest.mark.slow)]


@pytest.mark.parametrize("max_batch,line,tokens", KILLS)
def test_killed_then_run_again_equals_the_uninterrupted_run(tmp_path, reference, max_batch,
                                                            line, tokens):
    prompts, out = write_prompts(tmp_path / "prompts.jsonl"), tmp_path / "out.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "longspec.cli", "batch", ARGS[0], str(prompts),
                             "--out", str(out), *ARGS[1:], "--checkpoint-every", "0",
                             "--max-batch", str(max_batch)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    side, end = line_sidecar(out, line), time.monotonic() + 120
    while time.monotonic() < end:      # kill inside the line's generation, or once it ended
        try:
            record = json.loads(side.read_text()) if side.exists() else None
        except json.JSONDecodeError:
            pytest.fail("a torn sidecar was read: writes must be atomic")
        if record and len(record["token_ids"]) >= tokens:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            break
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.005)
    else:
        proc.kill()
        pytest.fail(f"the job did not reach {tokens} tokens of line {line}")
    assert len(out.read_text().splitlines() if out.exists() else []) < len(LINES)
    with open(out, "a") as f:
        f.write('{"id": "3", "te')        # as a kill in the middle of a line's write leaves it
    assert batch(prompts, out) == 0
    assert out.read_text() == reference and not sidecars(out)


def test_bad_input_is_refused_naming_the_line(tmp_path, capsys):
    job = Request(None)
    cases = {'{"prompt": "a"}\n[1, 2]\n': "line 2 must be a JSON object",
             '{"prompt": "a", "temprature": 1}\n': "line 1: unknown field 'temprature'",
             '{"id": "x", "prompt": "a"}\n{"id": "x", "prompt": "b"}\n':
                 "line 2: id 'x' is used by an earlier line",
             '{"messages": [], "prompt": "a"}\n': 'give either "prompt" or "messages"',
             '{"prompt": "a"\n': "line 1 is not JSON",
             '{"prompt": "a", "method": "heads", "prediction": "b"}\n':
                 "line 1: method 'heads' drafts nothing from a prediction",
             '{"prompt": "a", "temperature": -1}\n': "line 1: ",
             '{"prompt": "a", "max_new_tokens": 0}\n': "line 1: max_new_tokens must be",
             '{"custom_id": "a", "url": "/v1/embeddings", "body": {}}\n':
                 "line 1: an OpenAI batch line POSTs to",
             '{"custom_id": "a", "url": "/v1/completions", "body": {"model": "m"}}\n':
                 "line 1: body.prompt",
             '{"custom_id": "a", "url": "/v1/completions", "body": {"model": "m", '
             '"prompt": "x", "n": 2}}\n': "n 1, stream false",
             '{"custom_id": "a", "url": "/v1/completions", "body": {"model": "m", '
             '"prompt": "x", "echo": true}}\n': "echo=True is not supported",
             "\n": "holds no prompt"}
    for text, message in cases.items():
        path = tmp_path / "p.jsonl"
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_lines(path, job)
    out = tmp_path / "other.jsonl"
    out.write_text('{"id": "zzz"}\n')
    model = longspec.load_model("demo", dtype="float32")
    lines = read_lines(write_prompts(tmp_path / "prompts.jsonl"), job)
    with pytest.raises(ValueError, match="holds results of other lines"):
        list(run_job(model, lines, out))
    assert main(["batch", "demo", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_openai_batch_api_lines_get_openais_output_lines(tmp_path, model):
    """Lines of OpenAI's Batch API (custom_id, method, url, body with max_tokens and the rest)
    beside longspec's own; each output line is OpenAI's, its body what the server returns, its
    tokens what `generate` writes; run again, the same file."""
    lines = [{"custom_id": "req-1", "method": "POST", "url": "/v1/completions",
              "body": {"model": "demo", "prompt": "def parse(text):\n", "max_tokens": 20,
                       "temperature": 0.8, "seed": 9, "logprobs": 1}},
             {"custom_id": "req-2", "method": "POST", "url": "/v1/completions",
              "body": {"model": "demo", "prompt": "A date: ", "max_tokens": 24,
                       "structured_outputs": {"regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}}},
             {"prompt": "import os\n", "max_new_tokens": 8}]
    prompts = write_prompts(tmp_path / "prompts.jsonl", lines)
    out = tmp_path / "out.jsonl"
    assert batch(prompts, out) == 0
    first, second, own = [json.loads(raw) for raw in out.read_text().splitlines()]
    assert first["custom_id"] == "req-1" and first["error"] is None
    response = first["response"]
    assert response["status_code"] == 200
    body = response["body"]
    assert body["object"] == "text_completion" and body["id"] == "cmpl-req-1"
    ref = longspec.generate(model, "def parse(text):\n", max_new_tokens=20, seed=9,
                            sampling=longspec.SamplingConfig(temperature=0.8), logprobs=1)
    assert body["choices"][0]["text"] == ref.text
    assert body["choices"][0]["logprobs"]["token_logprobs"] == [
        lp["logprob"] for lp in ref.logprobs]
    assert body["usage"]["completion_tokens"] == len(ref.token_ids)
    date = second["response"]["body"]["choices"][0]["text"]
    assert len(date) == 10 and date[4] == date[7] == "-"
    assert own["id"] == "3" and "custom_id" not in own
    again = tmp_path / "again.jsonl"
    assert batch(prompts, again) == 0
    assert again.read_text() == out.read_text()


@pytest.mark.slow
def test_a_job_on_a_local_ray_cluster_writes_the_same_lines(tmp_path, reference):
    """Two Ray actors (a real local Ray instance, one loaded model each, stepping the lines they
    hold together) write the file the job writes without Ray, its finished lines kept and a
    torn one cut off."""
    pytest.importorskip("ray")
    prompts, out = write_prompts(tmp_path / "prompts.jsonl"), tmp_path / "out.jsonl"
    first_two = "".join(reference.splitlines(keepends=True)[:2])
    out.write_text(first_two + '{"id": "3", "te')
    assert batch(prompts, out, "--ray", "local", "--ray-actors", "2") == 0
    assert out.read_text() == reference
    fresh = tmp_path / "fresh.jsonl"
    assert batch(prompts, fresh, "--ray", "local", "--ray-actors", "2") == 0
    assert fresh.read_text() == reference

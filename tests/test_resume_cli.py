"""`longspec generate --output FILE --resume`: a run killed anywhere (SIGKILL included) and
resumed ends with exactly the text and tokens of an uninterrupted run; a sidecar made with other
settings is refused with one line naming the setting."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from longspec.cli import main
from longspec.jobs.sidecar import sidecar_path
from longspec.models import profile

ARGS = ["generate", "demo", "--prompt", "def parse(text):\n", "--method", "pld", "--seed", "3",
        "--min-p", "0.1", "--penalty", "1.2", "--penalty-window", "64", "--ignore-eos",
        "--no-progress", "--dtype", "float32"]
EARLIER = "earlier text\n"
N = 160     # new tokens of the killed runs


def generate(out, n, *extra):
    return main([*ARGS, "--max-new-tokens", str(n), "--output", str(out), *extra])


def sidecar(out):
    return json.loads(sidecar_path(out).read_text())


def start_killable(out, n, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "longspec.cli", *ARGS, "--max-new-tokens",
                             str(n), "--output", str(out), "--checkpoint-every", "0", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def kill_after(proc, out, tokens, timeout=120):
    """SIGKILL `proc` once its sidecar holds at least `tokens` committed tokens."""
    side, end = sidecar_path(out), time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            done = len(sidecar(out)["token_ids"]) if side.exists() else 0
        except json.JSONDecodeError:
            pytest.fail("a torn sidecar was read: writes must be atomic")
        if done >= tokens:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return done
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"the run did not reach {tokens} tokens")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of N tokens after EARLIER: the file's text and the JSON."""
    out = tmp_path_factory.mktemp("ref") / "out.txt"
    out.write_text(EARLIER)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert generate(out, N, "--json") == 0
    return out.read_text(), json.loads(printed.getvalue())


def resume(out, capsys, n=N):
    assert generate(out, n, "--resume", "--json") == 0
    return json.loads(capsys.readouterr().out)


def test_sigkill_then_resume_equals_the_uninterrupted_run(tmp_path, capsys, reference):
    text, ref = reference
    out = tmp_path / "out.txt"
    out.write_text(EARLIER)
    killed_at = kill_after(start_killable(out, N), out, 30)
    assert 30 <= killed_at < N and not sidecar(out)["finished"]
    res = resume(out, capsys)
    assert res["token_ids"] == ref["token_ids"] and res["text"] == ref["text"]
    assert res["stats"]["resumed_tokens"] >= killed_at
    assert out.read_text() == text == EARLIER + ref["text"]
    side = sidecar(out)
    assert side["finished"] and side["token_ids"] == ref["token_ids"]


@pytest.mark.slow
def test_killed_again_while_resuming_at_several_points(tmp_path, capsys, reference):
    text, ref = reference
    out = tmp_path / "out.txt"
    out.write_text(EARLIER)
    kill_after(start_killable(out, N), out, 5)
    for tokens in (40, 100, N - 20):
        kill_after(start_killable(out, N, "--resume"), out, tokens)
    assert resume(out, capsys)["token_ids"] == ref["token_ids"]
    assert out.read_text() == text


def interrupted_run(tmp_path, capsys, keep=12):
    """A finished 30-token run whose sidecar is then cut back, as if killed after `keep`."""
    out = tmp_path / "out.txt"
    assert generate(out, 30, "--json") == 0
    ref = json.loads(capsys.readouterr().out)
    side = sidecar(out)
    side.update(token_ids=side["token_ids"][:keep], finished=False, finish_reason=None)
    sidecar_path(out).write_text(json.dumps(side))
    with open(out, "a") as f:
        f.write("text past the sidecar's tokens, as a kill can leave")
    return out, ref


@pytest.mark.parametrize("change,named", [
    (["--seed", "4"], "seed=3, this command has seed=4"),
    (["--min-p", "0.2"], "min_p=0.1, this command has min_p=0.2"),
    (["--method", "ar"], "method='pld', this command has method='ar'"),
    (["--stop", "x"], "stop=[], this command has stop=['x']"),
    (["--dtype", "bfloat16"], "dtype='float32', this command has dtype='bfloat16'"),
    (["--prompt", "def other():\n"], "another prompt"),
])
def test_resume_with_other_settings_is_refused_naming_the_setting(tmp_path, capsys, change,
                                                                   named):
    out, _ = interrupted_run(tmp_path, capsys)
    assert generate(out, 30, "--resume", *change) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "cannot resume" in err
    assert generate(out, 31, "--resume") == 2
    assert "max_new_tokens=30, this command has max_new_tokens=31" in capsys.readouterr().err


def test_an_unfinished_run_needs_resume_and_then_completes(tmp_path, capsys):
    out, ref = interrupted_run(tmp_path, capsys)
    assert generate(out, 30) == 2
    assert "pass --resume" in capsys.readouterr().err
    res = resume(out, capsys, 30)
    assert res["token_ids"] == ref["token_ids"] and out.read_text() == ref["text"]
    assert res["stats"]["resumed_tokens"] == 12 and res["stats"]["new_tokens"] == 18


def test_resuming_a_finished_run_prints_its_text_and_generates_nothing(tmp_path, capsys):
    out = tmp_path / "out.txt"
    assert generate(out, 20) == 0
    printed = capsys.readouterr().out
    before = out.read_text()
    assert generate(out, 20, "--resume") == 0
    assert capsys.readouterr().out == printed and out.read_text() == before
    res = resume(out, capsys, 20)
    assert res["stats"]["steps"] == 0 and res["finish_reason"] == "length"
    # a new run (no --resume) after a finished one appends, with a sidecar of its own
    assert generate(out, 20) == 0
    assert out.read_text() == before * 2 and sidecar(out)["prefix_bytes"] == len(before.encode())


def test_resume_needs_output_and_a_readable_sidecar(tmp_path, capsys):
    assert main([*ARGS, "--max-new-tokens", "5", "--resume"]) == 2
    assert "pass --output" in capsys.readouterr().err
    out = tmp_path / "out.txt"
    sidecar_path(out).write_text("{not json")
    assert generate(out, 5, "--resume") == 2
    assert "is not a longspec run sidecar" in capsys.readouterr().err


def test_resume_under_another_kernel_profile_is_refused_unless_allowed(tmp_path, capsys):
    out, ref = interrupted_run(tmp_path, capsys)
    side = sidecar(out)
    recorded = side["settings"]["kernel_profile"]
    assert recorded["layers"] == "python" and "row_check" not in recorded
    side["settings"]["kernel_profile"] = {**recorded, "isa": "AMX", "torch": "2.99.0"}
    sidecar_path(out).write_text(json.dumps(side))
    assert generate(out, 30, "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another kernel profile" in err
    assert "isa 'AMX' -> " in err and "torch '2.99.0' -> " in err
    assert "--allow-profile-change" in err
    assert generate(out, 30, "--resume", "--allow-profile-change", "--json") == 0
    res = json.loads(capsys.readouterr().out)
    assert res["token_ids"] == ref["token_ids"]          # here the profile is the same one
    assert res["stats"]["kernel_profile"] == {**recorded, "row_check": "passed",
                                              "speculation": "on"}


def test_resume_under_other_kernel_code_is_refused_naming_the_digests(tmp_path, capsys,
                                                                      monkeypatch):
    out, ref = interrupted_run(tmp_path, capsys)
    written = sidecar(out)["settings"]["kernel_profile"]
    assert written["code"] == profile.code_digest()
    monkeypatch.setattr(profile, "code_digest", lambda: "0123456789abcdef")
    monkeypatch.setattr(profile, "version", lambda: "9.9.9")
    monkeypatch.setenv("LONGSPEC_HOME", str(tmp_path))     # the "new" code's row check apart
    assert generate(out, 30, "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--allow-profile-change" in err
    assert (f"other kernel code (digest {written['code']} when written, 0123456789abcdef now; "
            f"longspec {written['longspec']} -> 9.9.9)") in err
    assert generate(out, 30, "--resume", "--allow-profile-change", "--json") == 0
    res = json.loads(capsys.readouterr().out)
    assert res["token_ids"] == ref["token_ids"]      # only the digest differs, not the bits
    assert res["stats"]["kernel_profile"]["code"] == "0123456789abcdef"

"""The device check (benchmarks/gpu_check.py) and its staging (benchmarks/gpu_stage.py), run
here so that a GPU lease never meets them broken: the check's dry run on this CPU writes every
part, and a model cut into parts joins back only when every part arrived whole."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.fixture
def stage_module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_stage
    return gpu_stage


def test_a_model_cut_into_parts_joins_back_with_every_digest_checked(tmp_path, stage_module):
    source = tmp_path / "model.gguf"
    source.write_bytes(bytes(range(256)) * 14 + b"tail")
    stage = tmp_path / "stage"
    names = stage_module.split(source, stage, part_bytes=1000)
    assert names == ["part-1", "part-2", "part-3", "part-4"]
    assert stage_module.join(stage).read_bytes() == source.read_bytes()
    (stage / "part-3").write_bytes(b"x" * 1000)
    with pytest.raises(SystemExit, match="part-3"):
        stage_module.join(stage)
    (stage / "part-3").unlink()
    with pytest.raises(SystemExit, match="missing.*part-3"):
        stage_module.join(stage)


def test_sharegpts_head_is_staged_whole_and_unpacked_where_longspec_reads_it(tmp_path,
                                                                              stage_module):
    from longspec.models.sources import DATA
    from longspec.zoo.sharegpt import conversations

    records = [{"id": f"c{i}_0", "conversations": [{"from": "human", "value": "é" * 400},
                                                   {"from": "gpt", "value": "ok " * 200}]}
               for i in range(3000)]
    source = tmp_path / "sharegpt.json"
    source.write_text(json.dumps(records, ensure_ascii=False))
    stage = tmp_path / "stage"
    stage_module.split(source, stage, part_bytes=1 << 20)     # the manifest it extends
    stage_module.stage_sharegpt(source, stage, mb=1)          # cut inside a record
    out = stage_module.unstage_sharegpt(stage)
    assert out == stage / "home" / "data" / DATA["sharegpt"].file
    kept = list(conversations(out))
    assert 0 < len(kept) < len(records)


@pytest.mark.slow      # keeps the fast tier under five minutes
def test_a_part_that_fails_is_reported_and_the_others_still_run(tmp_path):
    out = tmp_path / "check.json"
    # a model that is not there: part a fails, part b runs after it (and fails too)
    run = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--dry-run",
                          "--out", str(out), "--parts", "a,b", "--model", str(tmp_path / "none")],
                         check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "2 part(s) failed" in run.stderr
    report = json.loads(out.read_text())
    assert [e["part"] for e in report["errors"]] == ["a", "b"]


@pytest.mark.slow
def test_the_device_check_dry_run_writes_every_part(tmp_path):
    out = tmp_path / "check.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--dry-run",
                    "--out", str(out), "--acceptance", "16=2.5"], check=True, timeout=900)
    report = json.loads(out.read_text())
    assert report["skipped"] == [] and report["errors"] == []
    exact = report["exactness"]
    assert {e["dtype"] for e in exact} == {"bfloat16", "float32"}
    assert all(e["identical"] for e in exact), [e for e in exact if not e["identical"]]
    turns = report["prompt_cache"]
    assert len(turns) == 4 and all(e["identical"] and e["cached_tokens"] > 0
                                   and e["fresh_cached_tokens"] == 0 for e in turns), turns
    assert {e["decoder"] for e in report["speed"]} == {"ar", "auto", "hf"}
    assert all(e["identical_to_ar"] for e in report["speed"] if e["decoder"] == "auto")
    costs = report["step_costs"]
    paths = ["triton+graphs", "triton", "products"]     # the kernel under the interpreter
    assert {(e["attention"], e["context"], e["rows"]) for e in costs} == {
        (a, c, r) for a in paths for c in (300, 1100) for r in (1, 16)}
    assert all(e["ms"] > 0 and e["floor_ms"] > 0 for e in costs)
    assert [(e["attention"], e["rows"]) for e in report["projected"]] == [(a, 16) for a in paths]
    batches = report["batches"]
    assert {(e["method"], e["max_batch"]) for e in batches} == {
        (m, b) for m in ("ar", "auto") for b in (1, 4, 8)}
    assert all(e["identical_to_one_at_a_time"] for e in batches)
    assert all(e["runs_captures_and_seconds"] == [[0, 0.0]] for e in batches)   # no CUDA here

"""The benchmark harness: outputs and their fields; Distinct-n and roofline arithmetic."""

import json

import pytest

from longspec.bench.metrics import answer_end, decode_bytes, distinct_n, is_loop, roofline_ms
from longspec.bench.runner import parse_entry, split_entries
from longspec.cli import main


@pytest.mark.unit
def test_distinct_n_hand_computed():
    tokens = [1, 2, 1, 2, 3]
    assert distinct_n(tokens, 1) == 3 / 5
    assert distinct_n(tokens, 2) == 3 / 4            # (1,2) (2,1) (1,2) (2,3)
    assert distinct_n(tokens, 3) == 3 / 3
    assert distinct_n(tokens, 6) == 0.0


@pytest.mark.unit
def test_a_loop_is_labelled_and_the_answer_end_found():
    assert is_loop([1, 2, 3, 4] * 50) and not is_loop(list(range(200)))
    assert answer_end([5, 6, 2, 7, 2], {2}) == 2 and answer_end([5, 6], {2}) is None


@pytest.mark.unit
def test_roofline_arithmetic():
    # 100 MB of weights, 1 KB of KV per token, 1000 tokens of context, 10 GB/s
    assert decode_bytes(100_000_000, 1000, 1000) == 101_000_000
    assert abs(roofline_ms(100_000_000, 1000, 1000, 10e9) - 10.1) < 1e-9


@pytest.mark.slow      # keeps the fast tier under five minutes
def test_bench_writes_results_table_and_plots(tmp_path, capsys):
    code = main(["bench", "demo", "--methods", "ar,pld,recycling[max_nodes=8],hf,hf-assisted",
                 "--gen-lens", "8,16", "--prompt-len", "64", "--out", str(tmp_path),
                 "--no-progress", "--temperature", "0", "--dtype", "float32"])
    assert code == 0
    report = json.loads((tmp_path / "results.json").read_text())
    rows = report["results"]
    assert len(rows) == 10
    assert {"device", "dtype", "versions", "command", "bandwidth_gb_s", "roofline"} <= set(report)
    done = [r for r in rows if r["status"] == "ok"]
    fields = {"method", "gen_len", "seconds", "tokens_per_s", "speedup_vs_ar", "speedup_vs_hf",
              "acceptance_rate", "mean_accepted_length", "distinct_1", "distinct_2", "distinct_3",
              "distinct_4", "answer_end", "loop", "peak_memory_bytes"}
    assert all(fields <= set(r) for r in done) and len(done) == 8
    assistant = [r for r in rows if r["method"] == "hf-assisted"]
    assert all(r["status"].startswith("unsupported") for r in assistant)
    assert "| recycling[max_nodes=8] | 16 |" in (tmp_path / "results.md").read_text()
    for name in ("speedup.png", "acceptance.png", "tokens_per_s.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert report["roofline"][0]["roofline_seconds"] > 0


@pytest.mark.unit
def test_entry_options_and_verify_mode():
    entry = parse_entry("draft[max_nodes=5,verify=rejection]", {})
    assert (entry.method == "draft" and entry.verify == "rejection"
            and entry.options == {"max_nodes": 5})
    assert parse_entry("tokenswift[ngram_top_k=0]", {}).verify == "match"
    with pytest.raises(ValueError, match="verify must be"):
        parse_entry("draft[verify=maybe]", {})
    with pytest.raises(ValueError, match="takes no options"):
        parse_entry("hf[verify=rejection]", {})


@pytest.mark.unit
def test_a_list_of_entries_keeps_the_commas_of_their_options():
    assert split_entries("ar, draft[max_nodes=17,max_depth=16],auto,") == [
        "ar", "draft[max_nodes=17,max_depth=16]", "auto"]


def test_bench_runs_the_transformers_peer_on_a_gguf_file(tmp_path):
    from gguf_writer import write_gguf
    from helpers import make_checkpoint

    hf = make_checkpoint(tmp_path / "hf", "llama")
    write_gguf(hf, tmp_path / "tiny.gguf", "Q8_0", tokenizer=True)
    code = main(["bench", str(tmp_path / "tiny.gguf"), "--methods", "ar,hf", "--gen-lens", "8",
                 "--prompt-len", "32", "--out", str(tmp_path / "out"), "--no-progress",
                 "--temperature", "0", "--dtype", "float32"])
    assert code == 0
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["status"] for r in report["results"]] == ["ok", "ok"]
    assert report["model"] == "tiny"


def test_llamacpp_peer_is_skipped_with_a_note_when_not_installed(tmp_path, capsys):
    from longspec.bench.peers import llamacpp_installed

    if llamacpp_installed():
        pytest.skip("llama-cpp-python is installed here")
    code = main(["bench", "demo", "--methods", "ar,llamacpp", "--gen-lens", "8",
                 "--prompt-len", "32", "--out", str(tmp_path), "--no-progress",
                 "--temperature", "0"])
    assert code == 0
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    assert next(r["status"] for r in rows if r["method"] == "llamacpp").startswith("skipped")

"""The row check can fail: a kernel wrong for one row count is caught at load, the model takes
a path that holds (the Python layers where the compiled ones fail), or decodes without
speculation where none does and says so; either way every method writes `ar`'s tokens."""

import json
import warnings

import pytest
from helpers import last_bit_flipped

import longspec
from longspec.cache.base import CHUNK
from longspec.cli import main
from longspec.models import selfcheck
from longspec.models.compiled import extension
from longspec.models.linear import DenseLinear
from longspec.models.native import NativeLayers

PROMPT = "def parse(text):\n"


def wrong_for(rows: int, forward):
    """`forward(self, x)` whose output is off in the last bit for `rows`-row inputs."""
    def planted(self, x):
        out = forward(self, x)
        return last_bit_flipped(out) if x.shape[0] == rows else out
    return planted


def loaded(monkeypatch, tmp_path, **kwargs):
    """The demo model loaded with a fresh row check (a cache directory of its own), and the
    warnings its load gave."""
    monkeypatch.setenv("LONGSPEC_HOME", str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = longspec.load_model("demo", device="cpu", **kwargs)
    return model, [str(w.message) for w in caught]


def same_tokens_as_ar(model, method="auto") -> dict:
    """Generates with `method` and with `ar`; asserts equal tokens; returns the method's stats."""
    settings = {"max_new_tokens": 40, "ignore_eos": True}
    ref = longspec.generate(model, PROMPT, method="ar", **settings)
    res = longspec.generate(model, PROMPT, method=method, **settings)
    assert res.token_ids == ref.token_ids
    return res.stats


@pytest.mark.unit
def test_the_checks_trees_cross_into_a_third_chunk_and_repeat_their_chains():
    """Every tree of 3 rows or more crosses 2 * CHUNK; each is a chain of at most CHAIN nodes
    (the depths run alone) with leaves hung off its nodes."""
    assert selfcheck.CONTEXT < 2 * CHUNK < selfcheck.CONTEXT + 3
    for n in selfcheck.ROWS:
        parents = selfcheck.tree_parents(n)
        chain = next((i for i in range(1, n) if parents[i] != i - 1), n)
        assert len(parents) == n and chain <= selfcheck.CHAIN
        assert all(0 <= p < chain - 1 for p in parents[chain:])


@pytest.mark.parametrize("rows", [3, 5, 13, 40])
def test_a_product_wrong_for_one_row_count_is_caught(tiny_model, monkeypatch, rows):
    monkeypatch.setattr(DenseLinear, "forward", wrong_for(rows, DenseLinear.forward))
    assert selfcheck.row_mismatch(tiny_model.net) == f"row 0 of a {rows}-row draft tree"


@pytest.mark.skipif(extension() is None, reason="no compiler for the compiled layers")
def test_compiled_layers_wrong_for_three_rows_give_way_to_the_python_ones(monkeypatch, tmp_path):
    compiled = NativeLayers.__call__

    def planted(self, x, *args):        # the compiled layers' output for 3 rows
        out, queries = compiled(self, x, *args)
        return (last_bit_flipped(out) if x.shape[0] == 3 else out), queries

    monkeypatch.setattr(NativeLayers, "__call__", planted)
    model, said = loaded(monkeypatch, tmp_path, quantize="q4")
    p = model.profile
    assert p.row_check == "compiled layers failed (row 0 of a 3-row draft tree): Python layers"
    assert (p.layers, p.attention, p.speculation) == ("python", "loops", "on")
    assert any("running the Python layers instead" in s for s in said)
    stats = same_tokens_as_ar(model)
    assert stats["speculation"] == "on"


def test_products_wrong_for_three_rows_on_every_path_turn_speculation_off(monkeypatch,
                                                                          tmp_path, capsys):
    monkeypatch.setattr(DenseLinear, "forward", wrong_for(3, DenseLinear.forward))
    model, said = loaded(monkeypatch, tmp_path, dtype="float32")
    p = model.profile
    failure = "Python layers with attention as products failed (row 0 of a 3-row draft tree)"
    assert p.row_check == failure
    assert p.speculation == f"off ({failure}): every method decodes as ar"
    assert any("decoding without speculation" in s for s in said)
    stats = same_tokens_as_ar(model)
    assert stats["speculation"] == p.speculation
    assert stats["steps"] == stats["new_tokens"] and stats["drafted_tokens"] == 0
    # the next load remembers the answer; `longspec info` says it in one line
    monkeypatch.setattr(selfcheck, "row_mismatch", lambda net: pytest.fail("checked again"))
    with pytest.warns(UserWarning, match="decoding without speculation"):
        assert main(["info", "demo", "--dtype", "float32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["speculation"] == p.speculation

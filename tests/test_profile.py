"""The kernel profile: named at load, checked on the host (a draft tree's rows against their
tokens run alone), shown by `longspec info` and kept with every run's stats."""

import functools
import json
import os
import time
import warnings
from importlib.metadata import version

import pytest
import torch

import longspec
from longspec.cli import main
from longspec.models import selfcheck
from longspec.models.profile import arithmetic, code_digest, package_imports

pytestmark = pytest.mark.profiles

def test_profile_names_the_kernels_and_the_row_check_passes():
    model = longspec.load_model("demo", dtype="float32", device="cpu")
    p = model.profile
    assert (p.device, p.weights, p.dtype, p.layers, p.attention) == (
        "cpu", "float32", "float32", "python", "products")
    assert p.isa in ("AMX", "AVX512_BF16", "AVX512", "AVX2", "DEFAULT")
    assert (p.row_check, p.speculation) == ("passed", "on")
    assert p.longspec == version("longspec") and p.code == code_digest() and len(p.code) == 16
    assert "fp32_min_rows=2" in p.rows
    res = longspec.generate(model, "x = 1\n", max_new_tokens=4, method="ar")
    assert res.stats["kernel_profile"] == p.as_dict()


def test_the_code_digest_covers_every_module_that_decides_a_token():
    """The modules a token's choice, the grammar and the tool calls import are all in it,
    their own imports too, with the compiled kernels' sources."""
    files = set(arithmetic())
    for module in ("sampling/sampler.py", "outputs/grammar.py", "outputs/tools.py",
                   "sampling/logits.py", "models/transformer.py", "models/linear.py"):
        assert module in files and package_imports(module) <= files, module
    assert {"models/native.cpp", "models/int4_mm.cpp", "sampling/noise.py",
            "sampling/penalty.py"} <= files
    assert "engine/generation.py" not in files and "step/sizing.py" not in files


@pytest.mark.compiled
def test_quantized_model_runs_the_compiled_loops():
    p = longspec.load_model("demo", quantize="q4", device="cpu").profile
    assert (p.weights, p.dtype, p.layers, p.attention) == ("int4", "bfloat16", "compiled",
                                                           "loops")
    assert p.int4_kernel == ("aten" if p.isa == "DEFAULT" else "int4_mm")


def test_the_row_check_finds_a_row_that_differs(tiny_model):
    net = tiny_model.net
    assert selfcheck.row_mismatch(net) is None
    wqkv = net.layers[0].wqkv
    forward = wqkv.forward
    # a product whose rows depend on how many there are, as a kernel can
    wqkv.forward = lambda x: forward(x) * (1 + 1e-3 * (x.shape[0] > 1))
    try:
        assert selfcheck.row_mismatch(net) == "row 0 of a 2-row draft tree"
    finally:
        del wqkv.forward


@pytest.mark.compiled
def test_compiled_layers_that_fail_the_check_give_way_to_python_ones(monkeypatch, tmp_path):
    monkeypatch.setenv("LONGSPEC_HOME", str(tmp_path))
    real = selfcheck.row_mismatch
    monkeypatch.setattr(selfcheck, "row_mismatch", lambda net: "row 3 of a 40-row draft tree"
                        if net.native is not None else real(net))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = longspec.load_model("demo", quantize="q4", device="cpu")
    assert model.net.native is None and model.profile.layers == "python"
    assert model.profile.row_check.startswith("compiled layers failed (row 3")
    assert any("running the Python layers instead" in str(w.message) for w in caught)
    # the answers are kept: the next load asks nothing
    monkeypatch.setattr(selfcheck, "row_mismatch", lambda net: pytest.fail("checked again"))
    assert longspec.load_model("demo", quantize="q4", device="cpu").profile.layers == "python"
    assert len(json.loads((tmp_path / "row-checks.json").read_text())) == 2


def test_info_prints_the_model_and_its_profile(capsys):
    assert main(["info", "demo", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "architecture" in out and "kernel profile" in out and "row_check" in out
    assert "speculation" in out and code_digest() in out
    assert main(["info", "demo", "--dtype", "float32", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kernel_profile"]["layers"] == "python" and info["layers"] == 8


@pytest.mark.unit
@pytest.mark.parametrize("features, limit, isa, build", [
    ({"amx_tile", "avx512_bf16", "vnni"}, "ALL", "AMX", "avx512_bf16"),
    ({"amx_tile", "avx512_bf16", "vnni"}, "AVX512_CORE_BF16", "AVX512_BF16", "avx512_bf16"),
    ({"amx_tile", "avx512_bf16", "vnni"}, "AVX512_CORE_VNNI", "AVX512", "avx512_vnni"),
    ({"avx512_bf16", "vnni"}, "ALL", "AVX512_BF16", "avx512_bf16"),
    ({"avx512_bf16", "vnni"}, "AVX512_CORE", "AVX512", "avx512_vnni"),
    ({"vnni"}, "ALL", "AVX512", "avx512_vnni"),
    (set(), "ALL", "AVX512", "avx512"),
])
def test_the_instruction_set_follows_the_cpu_and_onednn_max_isa(monkeypatch, features, limit,
                                                                 isa, build):
    """Which kernels an AVX-512 CPU's features and ONEDNN_MAX_CPU_ISA choose: AMX and bfloat16
    dot products only where the limit leaves them, the same build for AMX and BF16."""
    from longspec.models import compiled
    for feature in ("amx_tile", "avx512_bf16", "vnni"):
        monkeypatch.setattr(compiled.torch.cpu, f"_is_{feature}_supported",
                            lambda f=feature: f in features, raising=False)
    monkeypatch.setattr(compiled.torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
    assert compiled.cpu_isa() == isa
    assert compiled._instruction_set()[0] == build


def failing_build(monkeypatch, tmp_path):
    """compiled.py with a build for AVX-512 bfloat16 that the compiler refuses."""
    from torch.utils import cpp_extension

    from longspec.models import compiled

    def fail(*args, **kwargs):
        raise RuntimeError("c++: error: unrecognized command-line option '-mavx512bf16'")

    monkeypatch.setattr(compiled, "_instruction_set",
                        lambda: ("avx512_bf16", compiled.VNNI_FLAGS + compiled.BF16_FLAGS))
    monkeypatch.setattr(compiled, "_build", functools.cache(compiled._build.__wrapped__))
    monkeypatch.setattr(cpp_extension, "load", fail)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("LONGSPEC_NATIVE", raising=False)
    return compiled


@pytest.mark.unit
def test_a_failed_build_falls_back_with_a_warning_naming_the_compiler(monkeypatch, tmp_path):
    compiled = failing_build(monkeypatch, tmp_path)
    monkeypatch.delenv("LONGSPEC_REQUIRE_COMPILED", raising=False)
    with pytest.warns(UserWarning, match=r"-mavx512bf16.*g\+\+ 10 or later"):
        assert compiled.extension.__wrapped__() is None


@pytest.mark.unit
def test_a_failed_build_is_an_error_where_compiled_code_is_required(monkeypatch, tmp_path):
    compiled = failing_build(monkeypatch, tmp_path)
    monkeypatch.setenv("LONGSPEC_REQUIRE_COMPILED", "1")
    with pytest.raises(RuntimeError, match=r"-mavx512bf16.*LONGSPEC_REQUIRE_COMPILED=1 makes "
                                           r"that an error"):
        compiled.extension.__wrapped__()
    # asking for no compiled code is no failed build
    monkeypatch.setenv("LONGSPEC_NATIVE", "0")
    assert compiled.extension.__wrapped__() is None


@pytest.mark.unit
def test_a_lock_left_by_a_killed_build_is_removed_and_a_recent_one_waited_for(tmp_path, capsys):
    from longspec.models import compiled

    lock = tmp_path / "lock"
    lock.touch()
    compiled._clear_stale_lock(lock)
    assert lock.exists() and "waiting for another process" in capsys.readouterr().err
    old = time.time() - compiled.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    compiled._clear_stale_lock(lock)
    assert not lock.exists() and "interrupted build" in capsys.readouterr().err
    compiled._clear_stale_lock(lock)
    assert capsys.readouterr().err == ""


@pytest.mark.unit
@pytest.mark.parametrize("isa, limit, expected", [
    ("AVX512", "ALL", True), ("AVX512", "AVX512_CORE_VNNI", True), ("AVX512", "AVX2", False),
    ("AVX512_BF16", "ALL", False), ("AMX", "ALL", False), ("AVX2", "AVX2", False),
])
def test_bfloat16_products_take_the_inner_product_where_onednn_emulates_bfloat16(
        monkeypatch, isa, limit, expected):
    """On AVX-512 without bfloat16 instructions oneDNN's bfloat16 matmul sums rows by row count
    and its inner product does not; with less than AVX-512 it has no bfloat16 inner product."""
    from longspec.models import linear
    monkeypatch.setattr(linear, "cpu_isa", lambda: isa)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
    cpu = torch.device("cpu")
    assert linear.inner_products(torch.bfloat16, cpu) is expected
    assert linear.inner_products(torch.float32, cpu)
    assert not linear.inner_products(torch.bfloat16, torch.device("meta"))

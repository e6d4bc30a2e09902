"""Fixtures shared by the drafter tests: a tiny random model that trains on bytes, a text
file, an EAGLE drafter for the demo model trained in the session (a few seconds) and step costs
that do not depend on how busy the machine is; the `compiled` mark of the compiled code's tests;
and the switch that proves the exactness tests can fail (LONGSPEC_TEST_PERTURB_ROW=1)."""

import os
import sysconfig
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import last_bit_flipped, make_checkpoint

import longspec
from longspec.engine.batch_cost import BatchCost
from longspec.models.compiled import extension, int4_mm_built
from longspec.models.transformer import Transformer
from longspec.step.sizing import StepCost

# tests run in a process per core (pyproject.toml's addopts): a thread each, not as many threads
# as cores each
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    torch.set_num_threads(1)

# on a CPU Triton's kernels (models/tree_attention.py) run in its interpreter, which must be
# chosen before triton is first imported
if os.environ.get("LONGSPEC_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

# standard-library files the demo model saw in training: ~19K tokens
DEMO_DATA = ("textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "queue.py", "heapq.py")


def perturb_one_row() -> None:
    """The test-only switch LONGSPEC_TEST_PERTURB_ROW=1: every forward of two rows or more gives
    its last row's first hidden state (after the layers, compiled or Python, whatever kernels
    the profile runs) with its lowest bit flipped, as a kernel whose sums for a row depend on
    the rows beside it would. Each kernel profile's exactness run must fail under it (.ci/run
    checks that it does). The row check runs afresh in a cache directory of its own, so that it
    neither takes the answers of unperturbed runs nor leaves its own for them."""
    layers = Transformer._layers

    def perturbed(self, tokens, *args):
        x, queries = layers(self, tokens, *args)
        if x.shape[0] > 1:
            x = x.clone()
            x[-1, :1] = last_bit_flipped(x[-1, :1])
        return x, queries

    Transformer._layers = perturbed
    os.environ["LONGSPEC_HOME"] = tempfile.mkdtemp(prefix="longspec-perturbed-")


def pytest_configure(config):
    if os.environ.get("LONGSPEC_TEST_PERTURB_ROW") == "1":
        perturb_one_row()


def compiled_code_absent(int4_mm: bool) -> str | None:
    """Why the compiled code (and, with `int4_mm`, longspec::int4_mm) is not here, or None.
    Under LONGSPEC_REQUIRE_COMPILED=1 a build that fails raises (compiled.py's extension)."""
    if extension() is None:
        return "no compiled code here: LONGSPEC_NATIVE=0, or no compiler (a warning said so)"
    if int4_mm and not int4_mm_built():
        return "longspec::int4_mm is built for CPUs with AVX2 or AVX-512 only"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    """A test marked `compiled` (`compiled("int4_mm")`: that operator too) skips where that
    code is absent, and fails where LONGSPEC_REQUIRE_COMPILED=1 and its build failed."""
    mark = item.get_closest_marker("compiled")
    if mark is None:
        return
    try:
        absent = compiled_code_absent("int4_mm" in mark.args)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    if absent is not None:
        pytest.skip(absent)


def flat_step_seconds(n: int) -> float:
    """The step cost `costs_that_pay` reports for a tree of n nodes: one second, and 2% more a
    node, under which a drafted node pays where its chance is more than a few percent."""
    return 1.0 + 0.02 * n


@pytest.fixture
def costs_that_pay(monkeypatch):
    """Adaptive sizing decides from step costs as `flat_step_seconds` gives them, not as timed,
    so what it drafts depends on the text alone: on a slow or busy machine the measured costs
    can rightly make it draft nothing, and a test that must see drafts verified would then
    compare plain decoding with itself. Each size is still measured by a real step (a
    generation alone: its draft's best nodes, committed; a batch: a throwaway step, whose keys
    land in uncommitted slots: the equality tests check that nothing else moves), its time
    taken as `flat_step_seconds` gives it, so that the real steps' times do not lower the
    costs; nor do earlier generations' timings in the model's shared table stand in for a
    measure (a batch's plain step is one generation's over as many rows), nor are these costs
    recorded there (the table's file, which later tests and processes read, keeps real
    timings only)."""
    refresh, observe = StepCost.refresh, StepCost.observe

    def fixed(self, context, measure):
        refresh(self, context, None if measure is None
                else lambda n: (measure(n), flat_step_seconds(n))[1])

    monkeypatch.setattr(StepCost, "refresh", fixed)
    monkeypatch.setattr(StepCost, "observe",
                        lambda self, n, seconds: observe(self, n, flat_step_seconds(n)))
    monkeypatch.setattr(StepCost, "_lookup", lambda self, rows: None)   # no earlier timings
    monkeypatch.setattr(StepCost, "_record", lambda self, rows, seconds: None)
    monkeypatch.setattr(BatchCost, "plain_step", lambda self: self.extra(self.members))


class ByteTokenizer:
    """Enough of a tokenizer for training on text: bytes as ids."""

    eos_token_id = None

    def __call__(self, text):
        return {"input_ids": list(text.encode())}

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i < 256).decode(errors="replace")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base")
    make_checkpoint(path, "llama", vocab=300, max_positions=256)
    return path


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    m = longspec.load_model(tiny_model_dir, dtype="float32", device="cpu")
    m.tokenizer = ByteTokenizer()
    return m


@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    return path


def demo_data() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [root / name for name in DEMO_DATA]


@pytest.fixture(scope="session")
def demo_eagle(tmp_path_factory) -> Path:
    """The directory of an EAGLE drafter for the demo model: 30 steps of 2 x 128 tokens, guessing
    among the data's 1024 most frequent tokens (so that drafting over a draft vocabulary is what
    the exactness tests run). Trained once a test run: the first process of the run that needs
    it trains it, the others wait for it and read it."""
    from filelock import FileLock

    from longspec.training.drafters import DrafterTraining, train_drafter

    run = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run = run.parent            # the run's directory, above each process's own
    out = run / "demo_eagle"
    with FileLock(str(run / "demo_eagle.lock")):
        if not (run / "demo_eagle.trained").exists():
            model = longspec.load_model("demo", dtype="float32", device="cpu")
            cfg = DrafterTraining(kind="eagle", steps=30, batch_size=2, seq_len=128,
                                  warmup_steps=3, draft_vocab=1024)
            train_drafter(model, demo_data(), cfg, out=out, progress=False)
            (run / "demo_eagle.trained").touch()
    return out

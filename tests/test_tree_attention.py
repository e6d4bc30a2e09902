"""The Triton tree attention kernel (models/tree_attention.py): it computes attention (against
attention.py's products), every row of a draft tree is bitwise the same token run alone after
its ancestors (across chunk and split boundaries), a step at static shapes (models/graphs.py)
gives the eager forward's rows, and a model whose attention runs in it (its tree steps at
static shapes) writes with suffix and recycling drafts what `ar` writes. On a CPU Triton's
interpreter runs the kernels, in float32 only (its products of bfloat16 tiles are wrong in
Triton 3.9), the whole model's tests and the split boundary in the slow tier; with
LONGSPEC_TEST_DEVICE=cuda they run on the GPU, in bfloat16 too, and the steps are captured.
Generations batched on such a model (their steps at static shapes together: BatchSteps) each
get their rows alone and write what they write alone."""

import pytest
import torch

pytest.importorskip("triton")   # conftest.py chose the interpreter on a CPU
from helpers import DEVICE, make_checkpoint

import longspec
from longspec.cache import StaticCache
from longspec.cache.base import CHUNK
from longspec.models.attention import block_layout, block_order, grouped_attention
from longspec.models.graphs import BATCH_GRAPHS, BatchSteps, StaticSteps
from longspec.models.prefill import prefill
from longspec.models.tree_attention import SPLIT, tree_attention
from longspec.state.captures import Captures, EagerRuns
from longspec.step.tree import DraftTree, TreeShape

KV_HEADS, GROUP, HEAD_DIM = 2, 3, 16
PARENTS = [-1, 0, 0, 1, 1, 2, 3, 6, 7]          # a tree 5 deep, branching at 0 and 1
# committed lengths whose trees cross a chunk boundary, a split boundary, or neither (those at
# the split, whose 4 chunks the interpreter takes seconds over, in the slow tier)
STARTS = [10, CHUNK - 3, *(pytest.param(start, marks=pytest.mark.slow)
                           for start in (SPLIT * CHUNK - 2, SPLIT * CHUNK + 5))]
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def random_block(start: int, q_len: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    slots = -(-(start + q_len) // CHUNK) * CHUNK
    keys, values = (torch.randn(KV_HEADS, slots, HEAD_DIM, generator=gen) for _ in range(2))
    q = torch.randn(q_len, KV_HEADS * GROUP, HEAD_DIM, generator=gen)
    return (t.to(DEVICE, dtype) for t in (q, keys, values))


def kernel(q, keys, values, start, mask):
    n = start + q.shape[0]
    return tree_attention(q, keys[:, :n], values[:, :n], start,
                          block_layout(mask, q.shape[0], q.device), HEAD_DIM ** -0.5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_kernel_computes_the_attention_the_products_compute(start, shape, dtype):
    parents = list(range(-1, len(PARENTS) - 1)) if shape == "chain" else PARENTS
    mask = TreeShape(parents, torch.device(DEVICE)).mask(dtype)
    q, keys, values = random_block(start, len(parents), dtype)
    n = start + len(parents)
    expect = grouped_attention(q, keys[:, :n], values[:, :n], start, mask, block_order(mask),
                               HEAD_DIM ** -0.5)
    got = kernel(q, keys, values, start, mask)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expect, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("start", STARTS)
def test_every_tree_row_is_bitwise_its_token_run_alone(start, dtype):
    shape = TreeShape(PARENTS, torch.device(DEVICE))
    q, keys, values = random_block(start, len(PARENTS), dtype)
    tree = kernel(q, keys, values, start, shape.mask(dtype))
    for row in range(len(PARENTS)):
        path = [row]
        while PARENTS[path[-1]] >= 0:
            path.append(PARENTS[path[-1]])
        path.reverse()                        # the root, ..., the row: its keys in depth order
        depth = len(path) - 1
        alone_keys, alone_values = keys.clone(), values.clone()
        for j, node in enumerate(path):       # the ancestors committed at consecutive slots
            alone_keys[:, start + j] = keys[:, start + node]
            alone_values[:, start + j] = values[:, start + node]
        alone = kernel(q[row:row + 1], alone_keys, alone_values, start + depth, None)
        assert torch.equal(tree[row], alone[0]), (start, row)


@pytest.fixture(scope="module")
def triton_model(tmp_path_factory):
    """A tiny model whose attention runs in the kernel: its row check under the interpreter
    takes a minute, so the tests that use it are in the slow tier."""
    out = tmp_path_factory.mktemp("tiny")
    make_checkpoint(out, "llama", heads=KV_HEADS * GROUP, kv_heads=KV_HEADS,
                    hidden=KV_HEADS * GROUP * HEAD_DIM, vocab=64)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LONGSPEC_ATTENTION", "triton")
        model = longspec.load_model(out, device=DEVICE, dtype="float32")
    assert model.profile.attention == "triton" and model.profile.row_check == "passed"
    return model


GREEDY = longspec.SamplingConfig(temperature=0)
SAMPLED = longspec.SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=16)


@pytest.mark.slow
@pytest.mark.parametrize("method,setting", [("suffix", SAMPLED), ("recycling", GREEDY)])
@pytest.mark.usefixtures("costs_that_pay")   # the interpreter's trees cost what no card's do
def test_a_model_with_attention_in_the_kernel_writes_what_ar_writes(triton_model, method,
                                                                    setting):
    prompt = [5, 9, 14, 5, 9, 22, 31, 5, 9, 14, 40, 7] * 2
    kwargs = {"max_new_tokens": 40, "sampling": setting, "seed": 3, "ignore_eos": True}
    expect = longspec.generate(triton_model, prompt, method="ar", **kwargs)
    # trees of at most 16 nodes: one bucket, and the interpreter's minutes stay few
    options = {"gate": "off"} if method == "auto" else {"sizing": "fixed", "max_nodes": 16}
    res = longspec.generate(triton_model, prompt, method=method, options=options, **kwargs)
    assert res.token_ids == expect.token_ids
    assert res.stats["accepted_draft_tokens"] > 0


@pytest.mark.slow
def test_a_step_at_static_shapes_gives_the_eager_forwards_rows(triton_model):
    # the tree and a lone token through their buckets (graphs.py: captured on CUDA, eager here)
    # against the eager forward over the same cache, bit for bit
    net = triton_model.net
    cache = StaticCache(net.config, 200, net.dtype, net.device)
    prefill(net, torch.arange(3, 43, device=net.device), cache, 0)
    steps = StaticSteps(net, cache, Captures())
    for parents in (PARENTS, [-1]):
        shape = TreeShape(parents, net.device)
        tokens = torch.arange(5, 5 + shape.n, device=net.device)
        eager = net(tokens, shape.depth + cache.length, cache, shape.mask(net.dtype),
                    return_hidden=True)
        static = steps(DraftTree(shape, tokens), 10)
        assert torch.equal(static.logits, eager.logits)
        assert torch.equal(static.hidden, eager.hidden)
    assert sorted(steps.buckets) == [1, 16]


@pytest.mark.slow
def test_a_batchs_step_at_static_shapes_gives_each_member_its_eager_rows(triton_model):
    # two generations at other contexts, a tree and a lone token, through their buckets in
    # one forward (on CUDA captured the second time: the run on a card checks that), against
    # each one's eager forward over its own cache, bit for bit
    net = triton_model.net
    members = []
    for context, parents in ((40, PARENTS), (7, [-1])):
        cache = StaticCache(net.config, context + 80, net.dtype, net.device)
        prefill(net, torch.arange(3, 3 + context, device=net.device) % 60, cache, 0)
        shape = TreeShape(parents, net.device)
        tree = DraftTree(shape, torch.arange(5, 5 + shape.n, device=net.device))
        eager = net(tree.tokens, shape.depth + cache.length, cache, shape.mask(net.dtype),
                    return_hidden=True)
        members.append((StaticSteps(net, cache, Captures()), tree, eager))
    batch = BatchSteps(net, Captures())
    outs = batch([m[0] for m in members], [m[1] for m in members], [10, 10])
    for (_, tree, eager), out in zip(members, outs):
        assert torch.equal(out.logits, eager.logits)
        assert torch.equal(out.hidden, eager.hidden)
        assert torch.equal(out.top_tokens(4), eager.top_tokens(4))
    assert len(batch.graphs) == 1
    batch.forget(members[1][0])         # a member left: its combinations go
    assert not batch.graphs
    assert BATCH_GRAPHS >= 2


def test_a_step_is_captured_where_its_recurring_pays_for_the_capture():
    captures, ran = Captures(), EagerRuns()
    assert not captures.due(ran, 1000)      # a first run is eager: it may not recur
    assert ran.timed(lambda: 7) == 7 and ran.runs == 1 and ran.fastest_s < 1
    assert captures.due(ran, None)          # before any capture is timed, one eager run
    captures.measured(0.1, EagerRuns(runs=1, fastest_s=0.02))   # five eager runs' seconds
    # a step that may recur as often as not known: once its eager runs cost a capture
    assert not captures.due(EagerRuns(runs=4, fastest_s=0.02), None)
    assert captures.due(EagerRuns(runs=5, fastest_s=0.02), None)
    # a plain step: at once where its tokens left would pay for it, never where not
    assert captures.due(EagerRuns(runs=1, fastest_s=0.02), 5)
    assert not captures.due(EagerRuns(runs=40, fastest_s=0.02), 4)
    captures.measured(0.3, EagerRuns())     # nothing to weigh a capture against: nothing learned
    assert captures.runs == pytest.approx(5)


@pytest.mark.slow
def test_a_generation_on_a_finished_ones_cache_and_steps_writes_what_it_writes_alone(
        triton_model):
    prompts = [[5, 9, 14, 5, 9, 22, 31] * 3, [3, 4, 5, 6] * 5]
    kwargs = {"max_new_tokens": 12, "sampling": SAMPLED, "seed": 3, "ignore_eos": True}
    triton_model.state.clear()
    alone = longspec.generate(triton_model, prompts[1], method="ar", **kwargs).token_ids
    triton_model.state.clear()
    longspec.generate(triton_model, prompts[0], method="ar", **kwargs)
    assert len(triton_model.state.kept_caches) == 1
    after = longspec.generate(triton_model, prompts[1], method="ar", **kwargs)
    assert after.token_ids == alone
    assert len(triton_model.state.kept_caches) == 1      # taken, and given back at its end


@pytest.mark.slow
@pytest.mark.usefixtures("costs_that_pay")
def test_generations_batched_on_a_model_with_attention_in_the_kernel_write_what_they_write_alone(
        triton_model):
    prompts = [[5, 9, 14, 5, 9, 22, 31, 5, 9, 14, 40, 7] * 2, [3, 4, 5, 6] * 5, [7, 8, 9]]
    kwargs = {"max_new_tokens": 24, "sampling": SAMPLED, "seed": 3, "ignore_eos": True,
              "options": {"sizing": "fixed", "max_nodes": 16}}
    alone = [longspec.generate(triton_model, p, method="suffix", **kwargs).token_ids
             for p in prompts]
    batched = longspec.generate_many(triton_model, prompts, max_batch=3, method="suffix",
                                     **kwargs)
    assert [r.token_ids for r in batched] == alone
    assert any(r.stats["accepted_draft_tokens"] for r in batched)

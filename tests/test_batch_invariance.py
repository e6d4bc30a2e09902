"""A batch-invariant forward: each row of a q-row forward (a chain or a draft tree over the
cache) is bitwise equal to the same token run alone after its ancestors, in float32 and
bfloat16. This is what makes every method token-identical to plain decoding in both dtypes."""

import pytest
import torch
from helpers import DEVICE, make_checkpoint

import longspec
from longspec.cache import StaticCache
from longspec.models.prefill import prefill
from longspec.step.tree import TreeShape

pytestmark = pytest.mark.profiles
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    # sizes that reach oneDNN's K > 1024 path and a GQA group of 3, as SmolLM2 has
    path = tmp_path_factory.mktemp("inv")
    make_checkpoint(path, "llama", hidden=192, intermediate=1536, heads=6, kv_heads=2,
                    vocab=512, max_positions=2048)
    return {dt: longspec.load_model(path, dtype=dt, device=DEVICE) for dt in DTYPES}


def alone(model, cache, context: int, path: list[int]) -> torch.Tensor:
    """Logits [len(path), vocab] of the path's tokens run one at a time after the context."""
    cache.rollback(context)
    rows = []
    for i, token in enumerate(path):
        out = model.net(torch.tensor([token], device=DEVICE),
                         torch.tensor([context + i], device=DEVICE), cache)
        cache.commit(1)
        rows.append(out.logits[0])
    cache.rollback(context)
    return torch.stack(rows)


def prefilled(model, context: int, seed: int) -> StaticCache:
    g = torch.Generator().manual_seed(seed)
    cache = StaticCache(model.config, context + 80, model.dtype, DEVICE)
    prefill(model.net, torch.randint(0, 512, (context,), generator=g).to(DEVICE), cache, 0)
    return cache


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("context", [7, 300, 1100])
def test_chain_rows_equal_tokens_run_alone(models, dtype, context):
    model = models[dtype]
    cache = prefilled(model, context, seed=context)
    tokens = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = alone(model, cache, context, tokens)
    for q in (2, 3, 4, 5, 8, 13, 16, 31, 64):
        shape = TreeShape.chain(q - 1, torch.device(DEVICE))
        out = model.net(torch.tensor(tokens[:q], device=DEVICE), shape.depth + context, cache,
                        shape.mask(dtype))
        differ = [i for i in range(q) if not torch.equal(out.logits[i], ref[i])]
        assert not differ, f"q={q}: rows {differ} differ"


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_tree_rows_equal_their_paths_run_alone(models, dtype):
    model = models[dtype]
    context = 257
    cache = prefilled(model, context, seed=5)
    parents = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 6, 7, 3, 11]
    tokens = torch.randint(0, 512, (len(parents),), generator=torch.Generator().manual_seed(2))
    tokens = tokens.to(DEVICE)
    shape = TreeShape(parents, torch.device(DEVICE))
    out = model.net(tokens, shape.depth + context, cache, shape.mask(dtype))
    for node in range(len(parents)):
        path = [int(n) for n in shape.paths[node] if n >= 0]
        ref = alone(model, cache, context, tokens[path].tolist())
        assert torch.equal(out.logits[node], ref[-1]), f"node {node} differs"


@pytest.mark.parametrize("group,d", [(3, 64), (1, 16)])
def test_attention_rows_equal_at_short_contexts(group, d):
    # bfloat16 products of at most 16^3 multiply-adds skip oneDNN and sum in another order: a
    # 1-token forward at a short context took that path and a 2-token one did not, and a score
    # on a rounding tie came out one step apart (seen on SmolLM2). Here every second key's
    # score is such a tie: 4 * 4 + 1 * 5.0625 = 21.0625 (halfway between two bfloat16 values)
    # plus d - 2 products too small to move a running sum of 21 but not their own sum.
    from longspec.models.attention import grouped_attention

    kv_heads, tiny = 2, 2.0 ** -11
    q = torch.full((6, kv_heads * group, d), tiny)
    q[..., 0], q[..., 1] = 4, 1
    keys = torch.full((kv_heads, 256, d), tiny)
    keys[..., 0], keys[..., 1] = 4, 5.0
    keys[:, ::2, 1] = 5.0625
    values = torch.randn(kv_heads, 256, d, generator=torch.Generator().manual_seed(0))
    q, keys, values = (t.to(DEVICE, torch.bfloat16) for t in (q, keys, values))
    differ = []
    for context in range(1, 48):
        one = grouped_attention(q[:1], keys[:, :context + 1], values[:, :context + 1],
                                context, None, None, d ** -0.5)
        for q_len in (2, 3, 6):
            mask = torch.full((q_len, q_len), float("-inf"), dtype=torch.bfloat16,
                              device=DEVICE).triu(1)
            out = grouped_attention(q[:q_len], keys[:, :context + q_len],
                                    values[:, :context + q_len], context, mask, None, d ** -0.5)
            if not torch.equal(out[0], one[0]):
                differ.append((context, q_len))
    assert not differ, f"rows differ at (context, q) {differ[:5]}"

"""Each logits processor against its formula, and position-keyed sampling."""

import math

import pytest
import torch

from longspec.sampling.logits import NUCLEUS_FLOOR, SamplingConfig, process_logits
from longspec.sampling.noise import PositionNoise, gumbel_at, gumbel_rows, noise_key
from longspec.sampling.sampler import Sampler, choices_together
from longspec.step.tree import DraftTree, TreeShape

pytestmark = pytest.mark.unit

NEG = float("-inf")


def logits(seed=0, n=3, v=50):
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed)) * 3


def kept(x):
    return torch.isfinite(x)


def test_temperature_divides_logits():
    x = logits()
    assert torch.allclose(process_logits(x, SamplingConfig(temperature=0.5)), x / 0.5)


def test_greedy_returns_raw_logits():
    x = logits()
    out = process_logits(x, SamplingConfig(temperature=0, top_k=3, top_p=0.5))
    assert torch.equal(out, x)


def test_top_k_keeps_the_k_largest():
    x = logits()
    out = process_logits(x, SamplingConfig(top_k=5))
    for row, o in zip(x, out):
        assert set(torch.nonzero(kept(o)).flatten().tolist()) == set(row.topk(5).indices.tolist())


def test_top_p_keeps_smallest_set_reaching_p():
    x = logits()
    out = process_logits(x, SamplingConfig(top_p=0.7))
    for row, o in zip(x, out):
        p, order = torch.softmax(row, -1).sort(descending=True)
        need = int((torch.cumsum(p, 0) < 0.7).sum()) + 1
        assert set(torch.nonzero(kept(o)).flatten().tolist()) == set(order[:need].tolist())


def test_min_p_drops_tokens_below_fraction_of_top():
    x = logits()
    out = process_logits(x, SamplingConfig(min_p=0.2))
    p = torch.softmax(x, -1)
    assert torch.equal(kept(out), p >= 0.2 * p.max(-1, keepdim=True).values)


def test_eta_threshold_formula():
    x = logits()
    eta = 0.05
    out = process_logits(x, SamplingConfig(eta=eta))
    p = torch.softmax(x, -1)
    h = -(p * p.log()).sum(-1, keepdim=True)
    eps = torch.minimum(torch.tensor(eta), math.sqrt(eta) * torch.exp(-h))
    expect = p >= eps
    expect[torch.arange(3), p.argmax(-1)] = True
    assert torch.equal(kept(out), expect)


def test_penalty_divides_positive_and_multiplies_negative_present_logits():
    x = torch.tensor([[2.0, -2.0, 3.0, -1.0]])
    present = torch.tensor([[True, True, False, False]])
    out = process_logits(x, SamplingConfig(temperature=0, penalty=2.0), present)
    assert out.tolist() == [[1.0, -4.0, 3.0, -1.0]]


def test_processors_apply_in_order_penalty_temperature_topk_topp_minp():
    x = logits(5, n=1)
    present = torch.zeros_like(x, dtype=torch.bool)
    present[0, x[0].argmax()] = True
    cfg = SamplingConfig(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05, penalty=1.5)
    y = torch.where(present, torch.where(x > 0, x / 1.5, x * 1.5), x) / 0.7
    y = y.masked_fill(y < y.topk(10).values[:, -1:], NEG)
    p, order = torch.softmax(y, -1).sort(descending=True)
    drop = (torch.cumsum(p, -1) - p) >= 0.9
    y = y.masked_fill(drop.scatter(-1, order, drop), NEG)
    p = torch.softmax(y, -1)
    y = y.masked_fill(p < 0.05 * p.max(), NEG)
    assert torch.equal(process_logits(x, cfg, present), y)


CPU = torch.device("cpu")


def test_position_noise_depends_only_on_seed_prompt_and_position():
    a, b = PositionNoise(7, [1, 2, 3], 100, CPU), PositionNoise(7, [1, 2, 3], 100, CPU)
    assert torch.equal(a.rows(10, 3)[1], b.rows(11, 1)[0])
    assert not torch.equal(a.rows(10, 1), a.rows(11, 1))
    assert not torch.equal(PositionNoise(8, [1, 2, 3], 100, CPU).rows(10, 1), a.rows(10, 1))
    assert not torch.equal(PositionNoise(7, [1, 2, 4], 100, CPU).rows(10, 1), a.rows(10, 1))


def test_noise_rows_are_uniform_gumbel_and_independent_across_prompts():
    vocab = 4096
    rows = gumbel_rows(noise_key(0, [5, 6]), torch.arange(200), vocab)
    u = torch.exp(-torch.exp(-rows.double()))            # back to the uniforms
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    other = gumbel_rows(noise_key(0, [5, 7]), torch.arange(200), vocab)
    # the same seed on another prompt: Gumbel-max picks over a flat row agree by chance only
    same = (rows.argmax(-1) == other.argmax(-1)).float().mean().item()
    assert same < 0.02
    assert torch.corrcoef(torch.stack([rows.flatten(), other.flatten()]))[0, 1].abs() < 0.01


def test_noise_values_are_those_of_its_definition():
    # pinned values: a change to the noise changes every sampled text of a seed and prompt
    key = noise_key(3, [1, 2, 3])
    assert key == 4630493637225032240
    expected = [float.fromhex(h) for h in ("0x1.14ac14p+0", "0x1.8bdd4ap-2", "0x1.773982p+0",
                                           "0x1.0e46a4p-2")]
    positions, tokens = torch.tensor([0, 7, 4095, 10**6]), torch.tensor([0, 151935, 42, 49151])
    for repeat in (1, 20):            # positions hashed as Python ints, then as a tensor
        g = gumbel_at(key, positions.repeat(repeat), tokens.repeat(repeat))
        assert g[:4].tolist() == expected


def test_noise_is_the_same_for_any_batch_of_positions():
    key = noise_key(3, [1])
    together = gumbel_rows(key, torch.tensor([4, 9, 2]), 500)
    alone = torch.cat([gumbel_rows(key, torch.tensor([t]), 500) for t in (4, 9, 2)])
    assert torch.equal(together, alone)


def test_noise_entries_alone_equal_whole_rows():
    key = noise_key(11, [3, 1, 4])
    positions = torch.randint(0, 10**6, (40,), generator=torch.Generator().manual_seed(0))
    rows = gumbel_rows(key, positions, 49152)
    for size in (1, 2, 3, 7, 64, 333):
        pick = torch.randint(0, 40, (size,)), torch.randint(0, 49152, (size,))
        assert torch.equal(gumbel_at(key, positions[pick[0]], pick[1]), rows[pick])


@pytest.mark.parametrize("kept_tokens", [5, 40])
def test_noise_added_to_a_few_finite_scores_equals_whole_rows(kept_tokens):
    vocab, noise = 200, PositionNoise(5, [2, 7], 200, CPU)
    x = logits(n=4, v=vocab)
    x = x.masked_fill(x < x.topk(kept_tokens, -1).values[:, -1:], NEG)
    positions = torch.tensor([30, 31, 31, 33])
    expected = x + gumbel_rows(noise.key, positions, vocab)
    assert torch.equal(noise.add(x, positions), expected)


@pytest.mark.parametrize("kept_tokens", [5, 200])
def test_noise_computed_where_it_is_added_equals_the_kept_rows(kept_tokens):
    # a GPU's way (no host work in the step) against a CPU's (rows kept, sparse rows)
    vocab = 200
    kept, computed = (PositionNoise(5, [2, 7], vocab, CPU) for _ in range(2))
    computed.keeps_rows = False
    x = logits(n=4, v=vocab)
    x = x.masked_fill(x < x.topk(kept_tokens, -1).values[:, -1:], NEG)
    positions = torch.tensor([30, 31, 31, 33])
    assert torch.equal(computed.add(x, positions), kept.add(x, positions))
    columns = torch.tensor([3, 150, 7])
    assert torch.equal(computed.add(x[:, columns], positions, columns),
                       kept.add(x[:, columns], positions, columns))


def test_gumbel_max_samples_follow_softmax():
    x = torch.tensor([[0.0, 1.0, 2.0]])
    noise = PositionNoise(0, [1], 3, CPU)
    picks = torch.cat([noise.add(x, torch.tensor([t])).argmax(-1) for t in range(6000)])
    freq = torch.bincount(picks, minlength=3).float() / 6000
    assert torch.allclose(freq, torch.softmax(x[0], -1), atol=0.03)


@pytest.mark.parametrize("field,value", [("temperature", -1), ("top_p", 0), ("top_p", 1.5),
                                         ("top_k", -1), ("top_k", 1.5), ("min_p", 1.0),
                                         ("eta", -0.1), ("penalty", 0), ("penalty_window", 0),
                                         ("temperature", float("nan")), ("penalty", float("inf"))])
def test_out_of_range_sampling_values_are_rejected(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value}).validate()


@pytest.mark.parametrize("scale", [0.01, 8.0])   # flat: full sort; peaked: top-k shortcut
def test_top_p_on_large_vocabulary_equals_sort_formula(scale):
    x = torch.randn(4, 3000, generator=torch.Generator().manual_seed(1)) * scale
    out = process_logits(x, SamplingConfig(top_p=0.8))
    probs = torch.softmax(x, -1)
    p, order = probs.sort(descending=True)
    drop = (torch.cumsum(p, -1) - p) >= 0.8
    ref = ~drop.scatter(-1, order, drop)
    # the same set, but that every token tied with the last one kept stays too
    extra = kept(out) & ~ref
    boundary = torch.where(ref, probs, torch.inf).min(-1, keepdim=True).values
    assert (kept(out) | ~ref).all() and (probs[extra] == boundary.expand_as(probs)[extra]).all()


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95])
def test_top_p_rows_built_from_their_likeliest_tokens_equal_a_full_sorts(top_p):
    """A row whose nucleus ends among its tokens of at least NUCLEUS_FLOOR probability is built
    from them alone; every row, so built or not, is the vocabulary masked at the threshold a
    full sort gives, bit for bit."""
    g = torch.Generator().manual_seed(2)
    scales = torch.tensor([0.01, 0.5, 2.0, 4.0, 8.0, 16.0] * 4)[:, None]
    x = torch.randn(len(scales), 49152, generator=g) * scales
    x[0, :5] = 30.0                               # tied on the boundary
    out = process_logits(x, SamplingConfig(top_p=top_p))
    probs = torch.softmax(x, -1)
    ordered = probs.sort(descending=True).values
    keep = ((torch.cumsum(ordered, -1) - ordered) < top_p).sum(-1, keepdim=True)
    expected = x.masked_fill(probs < ordered.gather(-1, keep - 1), NEG)
    assert torch.equal(out, expected)
    few = (probs >= NUCLEUS_FLOOR).sum(-1)
    assert ((few > keep[:, 0]) & (keep[:, 0] > 1)).any() and (few <= keep[:, 0]).any()


def test_top_p_keeps_every_token_tied_on_the_boundary_whatever_else_is_in_the_batch():
    vocab = 200
    tied = torch.full((vocab,), -30.0)
    tied[:3] = torch.log(torch.tensor([0.4, 0.3, 0.3]))
    flat = torch.zeros(vocab)                      # its nucleus reaches past the top candidates
    cfg = SamplingConfig(top_p=0.5)
    alone = kept(process_logits(tied[None], cfg))[0]
    batched = kept(process_logits(torch.stack([tied, flat]), cfg))[0]
    assert alone[:3].all() and alone.sum() == 3
    assert torch.equal(alone, batched)


def test_top_p_row_answer_does_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(16, 3000, generator=g) * torch.tensor([0.01, 8.0] * 8)[:, None]
    cfg = SamplingConfig(top_p=0.9)
    together = process_logits(rows, cfg)
    alone = torch.cat([process_logits(r[None], cfg) for r in rows])
    assert torch.equal(together, alone)


@pytest.mark.parametrize("config", [SamplingConfig(temperature=0, penalty=1.3, penalty_window=8),
                                    SamplingConfig(temperature=0.7, top_p=0.9),
                                    SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.2,
                                                   penalty_window=8)])
def test_several_generations_choices_together_are_each_ones_alone(config):
    vocab = 300
    g = torch.Generator().manual_seed(4)
    samplers, trees = [], []
    for k, parents in enumerate(([-1], [-1, 0, 0, 1], [-1, 0, 1])):
        prompt = [k + 1, 7, 9]
        sampler = Sampler(config, seed=k, prompt_ids=prompt, vocab_size=vocab,
                          device=torch.device("cpu"))
        sampler.commit(prompt + torch.randint(0, vocab, (20 + k,), generator=g).tolist())
        shape = TreeShape(parents, torch.device("cpu"))
        samplers.append(sampler)
        trees.append(DraftTree(shape, torch.randint(0, vocab, (shape.n,), generator=g)))
    logits = [torch.randn(t.n, vocab, generator=g) * 3 for t in trees]
    processed, choices = choices_together(samplers, trees, torch.cat(logits))
    alone = [s.tree_choices(t, x) for s, t, x in zip(samplers, trees, logits)]
    assert torch.equal(processed, torch.cat([a[0] for a in alone]))
    assert torch.equal(choices, torch.cat([a[1] for a in alone]))

"""verify="rejection": the output distribution converges to the target's exact distribution.

Toy models with a vocabulary of 8 generate two tokens; the exact joint distribution of those
tokens comes from enumerating the target's conditionals. The total variation distance between
it and the empirical distribution must shrink as samples grow and stay within sampling noise.
"""

import itertools
import math

import pytest
import torch
from helpers import make_checkpoint

import longspec
from longspec.api import Request, prepare
from longspec.cache import StaticCache, causal_mask
from longspec.models.prefill import drain
from longspec.sampling.logits import process_logits

V = 8
PROMPT = [(7 * i + 3) % V for i in range(40)]
SAMPLING = longspec.SamplingConfig(temperature=1.0, penalty=1.3, penalty_window=8)
SAMPLES = 1200
TRIFORCE = {"retrieval_budget": 16, "rebuild_every": 4, "streaming_window": 8, "gamma1": 2,
            "max_depth": 4}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = []
    for seed in (1, 2):
        path = tmp_path_factory.mktemp(f"toy{seed}")
        make_checkpoint(path, "llama", vocab=V, seed=seed)
        out.append(longspec.load_model(path, dtype="float32", device="cpu"))
    return out


def next_probs(model, ids):
    """The processed next-token distribution after `ids`, as plain decoding would sample it."""
    net = model.net
    cache = StaticCache(model.config, len(ids), torch.float32, "cpu")
    logits = net(torch.tensor(ids), torch.arange(len(ids)), cache,
                 causal_mask(len(ids), torch.float32, "cpu")).logits[-1:]
    window = ids[-SAMPLING.penalty_window:]
    present = torch.zeros(1, V, dtype=torch.bool)
    present[0, window] = True
    return torch.softmax(process_logits(logits, SAMPLING, present), -1)[0]


def exact_joint(model):
    first = next_probs(model, PROMPT)
    return {(a, b): float(first[a] * next_probs(model, PROMPT + [a])[b])
            for a, b in itertools.product(range(V), repeat=2)}


def total_variation(samples, exact):
    counts = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    return 0.5 * sum(abs(counts.get(k, 0) / len(samples) - p) for k, p in exact.items())


def noise_bound(exact, n):
    """Three times the expected TV distance of n exact samples (normal approximation)."""
    return 3 * 0.5 * sum(math.sqrt(2 * p * (1 - p) / (math.pi * n)) for p in exact.values())


def check_converges(samples, exact):
    few, many = samples[:len(samples) // 8], samples
    tv_few, tv_many = total_variation(few, exact), total_variation(many, exact)
    assert tv_few < noise_bound(exact, len(few))
    assert tv_many < noise_bound(exact, len(many))
    assert tv_many < tv_few
    return tv_many


def run(models, method, n, options=None):
    target, draft = models
    return [tuple(longspec.generate(target, PROMPT, max_new_tokens=2, method=method,
                                    draft_model=draft, sampling=SAMPLING, seed=s, ignore_eos=True,
                                    verify="rejection", options=options).token_ids)
            for s in range(n)]


def test_exact_distribution_is_far_from_the_draft_models(models):
    target, draft = models
    p, q = exact_joint(target), exact_joint(draft)
    # the test could tell a sampler that returned the draft's distribution: its samples would lie
    # at least TV(p, q) - noise_bound from p, beyond the noise bound the convergence check allows
    assert 0.5 * sum(abs(p[k] - q[k]) for k in p) > 2 * noise_bound(p, SAMPLES)


@pytest.mark.slow
def test_draft_rejection_sampling_converges_to_target_distribution(models):
    check_converges(run(models, "draft", SAMPLES, {"max_depth": 3}), exact_joint(models[0]))


@pytest.mark.slow
def test_triforce_rejection_sampling_converges_to_target_distribution(models):
    check_converges(run(models, "triforce", SAMPLES, TRIFORCE), exact_joint(models[0]))


@pytest.mark.slow
def test_triforce_middle_level_samples_the_retrieval_targets_distribution(models):
    target, draft = models
    engine, prompt = prepare(target, Request(PROMPT, max_new_tokens=2, method="triforce",
                                             sampling=SAMPLING, draft_model=draft, ignore_eos=True,
                                             verify="rejection", options=TRIFORCE))
    drain(engine.starting(prompt))
    tf = engine.drafter
    tf.level.sync(prompt)
    mid = tf.level.chain
    # the retrieval target's exact distribution over the first two tokens
    first_logits = mid.feed(prompt[mid.fed:])
    mark = mid.fed

    def mid_probs(ids, logits):
        window = ids[-SAMPLING.penalty_window:]
        present = torch.zeros(1, V, dtype=torch.bool)
        present[0, window] = True
        return torch.softmax(process_logits(logits, SAMPLING, present), -1)[0]

    first = mid_probs(prompt, first_logits)
    exact = {}
    for a in range(V):
        second = mid_probs(prompt + [a], mid.feed([a]))
        mid.rewind(mark)
        for b in range(V):
            exact[(a, b)] = float(first[a] * second[b])
    mid.rewind(mark - 1)
    assert 0.5 * sum(abs(exact[k] - p) for k, p in exact_joint(target).items()) > 0.02
    samples = []
    for s in range(SAMPLES):
        engine.sampler.rng.manual_seed(s)
        new, _ = tf.middle_step(prompt, [], 2)
        if len(new) < 2:
            new = new + tf.middle_step(prompt + new, new, 1)[0]
        samples.append(tuple(new[:2]))
        mid.rewind(mark - 1)
        tf.tiny.rewind(len(prompt) - 1)
    check_converges(samples, exact)

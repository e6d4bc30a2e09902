"""Verification on hand-built tries, and commit's cut at a stop token."""

import pytest
import torch
from helpers import make_checkpoint

import longspec
from longspec.api import Request, prepare
from longspec.models.prefill import drain
from longspec.step.tree import DraftTree, TreeShape
from longspec.step.verify import speculative_sample, verify_tree

CPU = torch.device("cpu")


def tree(parents, tokens):
    return DraftTree(TreeShape(parents, CPU), torch.tensor(tokens))


@pytest.mark.unit
def test_perfect_match_accepts_the_whole_chain_and_adds_the_bonus():
    t = tree([-1, 0, 1, 2], [5, 6, 7, 8])
    verdict = verify_tree(t, torch.tensor([6, 7, 8, 9]))
    assert verdict.accepted == [0, 1, 2, 3] and verdict.accept_length == 3
    assert verdict.tokens == [6, 7, 8, 9] and verdict.bonus_token == 9


@pytest.mark.unit
def test_early_mismatch_stops_at_the_first_wrong_draft():
    t = tree([-1, 0, 1, 2], [5, 6, 7, 8])
    verdict = verify_tree(t, torch.tensor([6, 4, 8, 9]))      # the target wants 4 after 6
    assert verdict.accepted == [0, 1] and verdict.tokens == [6, 4] and verdict.bonus_token == 4


@pytest.mark.unit
def test_first_draft_wrong_gives_the_target_token_alone():
    t = tree([-1, 0, 1], [5, 6, 7])
    verdict = verify_tree(t, torch.tensor([3, 7, 1]))
    assert verdict.accepted == [0] and verdict.accept_length == 0 and verdict.tokens == [3]


@pytest.mark.unit
def test_sibling_branch_is_chosen_when_it_matches():
    # root 5 -> {6 (node 1) -> 7 (node 3), 8 (node 2) -> 9 (node 4) -> 10 (node 5)}
    t = tree([-1, 0, 0, 1, 2, 4], [5, 6, 8, 7, 9, 10])
    # the target picks 8 after the root, 9 after 8, 11 after 9: the second branch, two deep
    choices = torch.tensor([8, 0, 9, 0, 11, 0])
    verdict = verify_tree(t, choices)
    assert verdict.accepted == [0, 2, 4] and verdict.tokens == [8, 9, 11]


@pytest.mark.unit
def test_a_lone_root_is_one_plain_decoding_step():
    verdict = verify_tree(tree([-1], [5]), torch.tensor([42]))
    assert verdict.accepted == [0] and verdict.tokens == [42]


def test_stop_token_inside_an_accepted_path_cuts_the_commit(tmp_path):
    make_checkpoint(tmp_path, "llama")
    model = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    greedy = longspec.SamplingConfig(temperature=0)
    prompt = [3, 4, 5, 6]
    ref = longspec.generate(model, prompt, max_new_tokens=6, sampling=greedy, ignore_eos=True,
                            method="ar")
    stop = ref.token_ids[2]
    first = ref.token_ids.index(stop)
    engine, ids = prepare(model, Request(prompt, max_new_tokens=6, method="pld", sampling=greedy,
                                         stop=[stop], ignore_eos=True))
    drain(engine.starting(ids))
    draft = DraftTree.chain([ids[-1], *ref.token_ids[:4]], CPU)   # all four drafts are right
    target, _ = engine.judge(draft, engine.forward(draft), 0.0)
    verdict = verify_tree(draft, target.target_tokens)
    assert verdict.accept_length == 4
    new = engine.commit(draft, target, verdict)
    assert new == ref.token_ids[:first + 1] and engine.done
    assert engine.stats.accepted_draft_tokens == first + 1 and engine.stats.new_tokens == first + 1
    assert engine.cache.length == len(ids) - 1 + first + 1     # keys of the root and kept drafts


def test_max_new_tokens_cut_counts_only_committed_drafts(tmp_path):
    make_checkpoint(tmp_path, "llama")
    model = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    res = longspec.generate(model, [1, 2, 1, 2, 1, 2, 1, 2], max_new_tokens=120, method="pld",
                            sampling=longspec.SamplingConfig(temperature=0), ignore_eos=True)
    s = res.stats
    assert s["new_tokens"] == 120 and s["accepted_draft_tokens"] <= 120 - s["steps"] + 1
    plain = longspec.generate(model, [1, 2], max_new_tokens=3, method="ar")
    assert plain.stats["acceptance_rate"] is None


class FixedSampler:
    """A sampler stand-in: uniforms from a generator, samples by Gumbel-max with it."""

    def __init__(self, seed):
        self.rng = torch.Generator().manual_seed(seed)

    def uniform(self, n):
        return torch.rand(n, generator=self.rng)

    def sample(self, logp):
        u = torch.rand(logp.shape, generator=self.rng).clamp_min(1e-20)
        return (logp - torch.log(-torch.log(u))).argmax(dim=-1)


@pytest.mark.unit
def test_rejection_accepts_with_p_over_q_and_resamples_from_the_residual():
    p = torch.tensor([[0.2, 0.8, 0.0], [0.3, 0.3, 0.4]])      # after the root, after the draft
    q = torch.tensor([[1.0, 0.0, 0.0]])                         # the draft is token 0 for sure
    sampler = FixedSampler(0)
    counts = {"accepted": 0, 1: 0, 0: 0, 2: 0}
    n = 4000
    for _ in range(n):
        accepted, token = speculative_sample(p, q, torch.tensor([0]), sampler)
        if int(accepted) == 1:
            counts["accepted"] += 1
        else:
            counts[int(token)] += 1
    # accepted with probability p/q = 0.2; on rejection the residual max(0, p - q) is token 1
    assert abs(counts["accepted"] / n - 0.2) < 0.03
    assert counts[0] == counts[2] == 0 and counts[1] == n - counts["accepted"]

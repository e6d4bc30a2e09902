"""Adaptive sizing measures a step size only when a choice needs it (by a timing step, or by the
next real step where a generation takes none), and chooses as if every size had been measured;
its calibration recovers from an unlucky start."""

import json
import random
import threading
from types import SimpleNamespace

import pytest
import torch

from longspec.drafters.auto import AutoDrafter, StepRates
from longspec.drafters.base import Budget
from longspec.engine.batch_cost import BatchCost
from longspec.sampling.logits import SamplingConfig
from longspec.sampling.sampler import Sampler
from longspec.state.shared import FILE_KEYS, SharedState, StepCostTable
from longspec.step.sizing import Calibration, Sizer, StepCost, generation_sizer
from longspec.step.tree import DraftTree

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def chain(chance: float, n: int) -> DraftTree:
    """A scored chain of n drafts, each following the one before with this chance."""
    plain = DraftTree.chain(list(range(n + 1)), CPU)
    return DraftTree(plain.shape, plain.tokens, scores=[chance ** i for i in range(n + 1)],
                     sources=[0] * (n + 1))


def sizer(max_nodes: int):
    """A sizer over a made-up step cost, and the sizes it measured."""
    measured: list[int] = []

    def measure(n: int) -> float:
        measured.append(n)
        return 0.02 + 0.005 * n                     # a node costs a fifth of a step

    cost = StepCost(max_nodes)
    cost.refresh(100, measure)
    return Sizer(cost, Calibration()), measured, measure


@pytest.mark.parametrize("chance", [0.05, 0.5, 0.9, 0.999])
def test_choice_is_the_one_every_size_measured_gives(chance):
    lazy, measured, _ = sizer(48)
    full, _, _ = sizer(48)
    full.cost(48)                                    # every size measured up front
    tree = chain(chance, 47)
    assert lazy.choose(tree, 0.001, 48).tree.n == full.choose(tree, 0.001, 48).tree.n
    assert measured == sorted(measured)


def test_sizes_that_cannot_pay_are_never_measured():
    s, measured, _ = sizer(48)
    choice = s.choose(chain(0.05, 47), 0.001, 48).tree
    assert choice.n <= 2
    assert max(measured) <= 4 and len(measured) == len(set(measured))   # each size once
    s, measured, _ = sizer(48)
    s.choose(chain(0.999, 47), 0.001, 48)
    assert max(measured) == 48                       # a sure chain is worth measuring for


def test_measurements_are_kept_until_the_context_moves():
    s, measured, measure = sizer(32)
    s.choose(chain(0.9, 31), 0.001, 32)
    count = len(measured)
    s.cost.refresh(200, measure)                     # moved less than REFRESH_MIN_TOKENS
    s.choose(chain(0.9, 31), 0.001, 32)
    assert len(measured) == count
    s.cost.refresh(100 + 4096, measure)
    s.choose(chain(0.9, 31), 0.001, 32)
    assert len(measured) > count


def test_real_steps_lower_a_measured_size_to_the_fastest_seen():
    s, measured, _ = sizer(32)
    s.cost(8)                                        # 1, 2, 4, 8 measured: 25-60 ms
    s.cost.observe(8, 0.020)                         # a faster real step of 8 nodes
    assert s.cost(8) == 0.020
    assert s.cost(4) == 0.020                        # a smaller step never costs more
    assert s.cost(1) == 0.020
    s.cost.observe(8, 0.5)                           # a slower one changes nothing
    s.cost.observe(16, 0.001)                        # nor one of a size not yet measured
    s.cost.observe(5, 0.001)                         # nor one between the sizes
    assert s.cost(8) == 0.020 and measured == [1, 2, 4, 8]
    assert s.cost(16) == pytest.approx(0.1)


@pytest.mark.parametrize("chance", [0.05, 0.9, 0.999])
def test_without_timing_steps_each_size_is_measured_by_the_next_real_step(chance):
    """A choice that needs a size not measured plans a step that measures it: the draft's best
    nodes, as many as that; once every size it needs is in, the choice is the one timing steps
    give."""
    timed, measured, measure = sizer(48)
    tree = chain(chance, 47)
    expected, timing = timed.choose(tree, 0.001, 48).tree.n, list(measured)
    s = Sizer(StepCost(48), Calibration())
    s.cost.refresh(100, None)
    asked = []
    while (plan := s.choose(tree, 0.001, 48)).timing:
        asked.append(plan.tree.n)
        assert plan.tree.tokens.tolist() == tree.tokens[:plan.tree.n].tolist()
        s.cost.observe(plan.tree.n, measure(plan.tree.n))
    assert asked == timing                          # the sizes the timing steps took
    assert plan.tree.n == expected and not plan.unmeasured
    s.cost.refresh(10**6, None)                      # a new context: nothing measured
    small = s.choose(chain(chance, 3), 0.001, 48)
    assert (small.timing, small.tree.n) == (True, 1)


def test_a_draft_smaller_than_the_size_a_choice_needs_asks_for_a_timing_step():
    s = Sizer(StepCost(48), Calibration())
    s.cost.refresh(100, lambda n: 0.01 * n)
    s.cost(4)                                        # 1, 2, 4 measured
    s.cost.refresh(100, None)
    plan = s.choose(chain(0.999, 5), 0.001, 48)
    assert plan.unmeasured == 8 and not plan.timing and plan.tree.n == 6


def test_a_failing_source_is_doubted_in_bins_it_has_not_tried():
    c = Calibration()
    fresh = c.chance(0, 0.3)
    for _ in range(30):
        c.record(chain(0.7, 1), [0])                 # its drafts estimated 0.7 all fail
    assert c.chance(0, 0.3) < fresh / 2              # an estimate of 0.3 is worth less now
    assert c.chance(1, 0.3) == fresh                 # another source's is not


def test_a_calibration_shared_reads_what_either_learns():
    batch_first, joined = Calibration(), Calibration()
    fresh = joined.chance(0, 0.7)
    joined.share(batch_first)
    for _ in range(30):
        batch_first.record(chain(0.7, 1), [0])       # its drafts estimated 0.7 all fail
    assert joined.chance(0, 0.7) == batch_first.chance(0, 0.7) < fresh / 2
    joined.record(chain(0.7, 1), [0, 1])
    assert joined.chance(0, 0.7) == batch_first.chance(0, 0.7)


def test_a_bin_that_failed_first_is_tested_again():
    """Drafts that follow their parent 85% of the time, whose first three were all rejected:
    the sizer keeps verifying some of them and learns their worth."""
    s, _, _ = sizer(16)
    tree = chain(0.5, 15)
    rng = random.Random(0)
    for step in range(300):
        chosen = s.choose(tree, 0.001, 16).tree
        accepted = [0]
        while step >= 3 and len(accepted) < chosen.n and rng.random() < 0.85:
            accepted.append(len(accepted))
        s.record(chosen, accepted)
    assert s.calibration.chance(0, 0.5) > 0.75
    assert s.choose(tree, 0.001, 16).tree.n > 4


def test_a_source_whose_first_drafts_all_failed_is_tested_again():
    """A suffix source's first drafts copy the prompt, which the answer does not repeat: ten
    fail across its bins. Later its drafts follow their parents 85% of the time. It must not be
    written off as a whole (seen: 9 of 14 runs of a chat answer with no draft verified after the
    first ten, 0.9x plain decoding)."""
    cost = StepCost(16)
    cost.refresh(100, lambda n: 0.0065 + 0.0021 * (n - 1))   # a node: a third of a step (AVX2)
    s = Sizer(cost, Calibration())
    rng = random.Random(0)
    for chance in (0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35):
        s.record(chain(chance, 1), [0])
    tree = chain(0.9, 15)
    for _ in range(300):
        chosen = s.choose(tree, 0.001, 16).tree
        accepted = [0]
        while len(accepted) < chosen.n and rng.random() < 0.85:
            accepted.append(len(accepted))
        s.record(chosen, accepted)
    assert s.choose(tree, 0.001, 16).tree.n > 4


def test_a_batch_prices_the_rows_past_its_roots_as_a_step_grows_from_as_many_rows():
    s, measured, _ = sizer(48)
    widest = SimpleNamespace(sizer=s)
    table = StepCostTable(threading.Lock())
    batch = BatchCost(table, 4, 400, widest)
    # no plain step of 4 seen yet: one generation's step over 4 rows stands in for it
    assert batch(4) == pytest.approx(s.cost(4))
    assert batch(20) - batch(4) == pytest.approx(s.cost(20) - s.cost(4))
    assert measured == [1, 2, 4, 8, 16, 32]          # timing steps of one generation only
    batch.observe(4, 0.01)                           # a real plain step of the batch
    seen = BatchCost(table, 4, 400, widest)
    assert seen(4) == pytest.approx(0.01)
    assert seen(20) == pytest.approx(0.01 + s.cost(20) - s.cost(4))


def test_a_token_ahead_of_a_closed_batchs_end_is_worth_the_seconds_its_member_adds():
    """Its member's leaving saves what a member adds to the batch's plain step, of a step whose
    G tokens take a G-th of its seconds each."""
    s, _, _ = sizer(48)                 # one generation: 25 ms over 1 row, 40 ms over 4
    table = StepCostTable(threading.Lock())
    batch = BatchCost(table, 4, 400, SimpleNamespace(sizer=s))
    assert batch.ahead_worth() == pytest.approx((0.040 - 0.025) / 3 / (0.040 / 4))
    batch.observe(4, 0.031)             # a real plain step of the 4: each past the first, 2 ms
    assert BatchCost(table, 4, 400, SimpleNamespace(sizer=s)).ahead_worth() == pytest.approx(
        0.002 / (0.031 / 4))


def test_forgetting_the_text_keeps_the_step_costs_and_clearing_does_not():
    state = SharedState()
    state.step_costs.record(1, 8, 100, 0.01)
    state.publish(("calibration", "auto"), Calibration())
    state.remember_output([5, 6, 7, 8, 9, 5, 6, 7])
    assert state.earlier_matches([5, 6], 4)[0] > 0
    state.forget_text()
    assert state.step_costs.lookup(1, 8, 100) == 0.01
    assert state.checkout(("calibration", "auto"), lambda: "fresh") == "fresh"
    assert state.earlier_matches([5, 6], 4)[0] == 0
    state.clear()
    assert state.step_costs.lookup(1, 8, 100) is None


def test_step_costs_are_kept_across_processes_and_replaced_once_timed_again(tmp_path):
    """What one process timed, the next reads for the same key (not for another); an entry
    read is replaced by this process's first timing of it, slower or not; a save keeps the
    entries other processes wrote; an unreadable file is an empty one."""
    path = tmp_path / "step-costs.json"
    first = StepCostTable(threading.Lock())
    first.keep_in(path, "host A")
    first.record(1, 8, 100, 0.010)
    first.record(4, 4, 3000, 0.020)
    first.save()
    other = StepCostTable(threading.Lock())
    other.keep_in(path, "host B")
    other.record(1, 8, 100, 0.5)
    other.save()
    second = StepCostTable(threading.Lock())
    second.keep_in(path, "host A")
    assert second.lookup(1, 8, 100) == 0.010 and second.lookup(4, 4, 3000) == 0.020
    second.record(1, 8, 100, 0.012)          # timed here: a busier machine today
    assert second.lookup(1, 8, 100) == 0.012
    second.record(1, 8, 100, 0.015)          # then the fastest seen, as always
    assert second.lookup(1, 8, 100) == 0.012
    second.save()
    third = StepCostTable(threading.Lock())
    third.keep_in(path, "host A")
    assert third.lookup(1, 8, 100) == 0.012 and third.lookup(4, 4, 3000) == 0.020
    assert third.lookup(1, 2, 100) is None
    third.clear()
    assert third.lookup(1, 8, 100) is None
    for k in range(FILE_KEYS - 1):            # the oldest keys make room for new ones
        table = StepCostTable(threading.Lock())
        table.keep_in(path, f"host {k}")
        table.record(1, 1, 100, 0.001)
        table.save()
    kept = json.loads(path.read_text())
    assert len(kept) == FILE_KEYS and "host A" in kept and "host B" not in kept
    path.write_text(json.dumps({"host A": {"1 8 100": "slow", "one": 0.1, "1 2 0": 0.003},
                                "host B": [1, 2]}))
    edited = StepCostTable(threading.Lock())       # entries not written by `save` left out
    edited.keep_in(path, "host A")
    assert edited.lookup(1, 2, 100) == 0.003 and edited.lookup(1, 8, 100) is None
    StepCostTable(threading.Lock()).keep_in(path, "host B")
    path.write_text("{not json")
    broken = StepCostTable(threading.Lock())
    broken.keep_in(path, "host A")
    assert broken.lookup(1, 8, 100) is None


def test_the_time_spent_measuring_is_counted():
    s, _, _ = sizer(16)
    s.cost(4)
    assert s.cost.measuring_s == pytest.approx(0.025 + 0.03 + 0.04)


def arms_taken(steps: int, tokens: float, seconds: float, budget: float | None = None
               ) -> list[bool]:
    """The arms `auto`'s gate takes when a drafting step writes `tokens` in `seconds` (in plain
    steps' time) and a plain step writes 1; with a batch's `budget` for its tries."""
    gate = StepRates(retried=(True,), budget=budget)
    taken = []
    for _ in range(steps):
        arm = gate.choose()
        taken.append(arm)
        gate.record(arm, tokens if arm else 1, seconds if arm else 1.0)
    return taken


def test_auto_takes_plain_steps_where_drafting_does_not_pay_and_retries_it():
    taken = arms_taken(190, 1.1, 1.2)
    assert taken[:2] == [True, False]        # each arm measured first
    drafted = [i for i, arm in enumerate(taken) if arm]
    # then plain, drafting again after 16 plain steps, 32, then 64 at most while it loses
    assert drafted == [0, 17, 50, 115, 180]


def test_a_retry_that_wins_brings_the_next_one_back_to_16_steps():
    gate = StepRates(retried=(True,))
    for arm, tokens, seconds in [(True, 1.1, 1.2)] + [(False, 1, 1.0)] * 16:
        assert gate.choose() == arm
        gate.record(arm, tokens, seconds)
    assert gate.choose()
    gate.record(True, 1.1, 1.2)                  # the retry lost: 32 steps to the next
    for _ in range(32):
        assert not gate.choose()
        gate.record(False, 1, 1.0)
    assert gate.choose()
    gate.record(True, 30, 1.0)                   # a retry that wins
    assert gate.every[True] == 16


def test_auto_never_forces_a_plain_step_where_drafting_pays():
    assert arms_taken(60, 2.5, 1.3).count(False) == 1     # the one that measured it


def test_a_budget_spaces_the_tries_by_what_they_lose():
    # plain steps first; the first try after 16 of them, then each once the tries lost at most
    # a hundredth of every step's seconds: a try losing 2 plain steps' seconds waits 180 steps
    # and more, one losing 0.5 about the 32 and 64 an unbudgeted gate waits
    dear = arms_taken(400, 1, 3.0, 0.01)
    assert [i for i, arm in enumerate(dear) if arm] == [16, 198, 396]
    cheap = arms_taken(400, 1, 1.5, 0.01)
    assert [i for i, arm in enumerate(cheap) if arm] == [16, 50, 115, 180, 245, 310, 375]
    for taken, lost in ((dear, 2.0), (cheap, 0.5)):
        spent = len(taken) + taken.count(True) * lost
        assert taken.count(True) * lost <= 0.01 * spent + lost    # the last try overdraws once


def test_a_budgeted_gate_drafts_on_where_drafting_pays():
    taken = arms_taken(60, 2.5, 1.3, 0.01)
    assert taken[:17] == [False] * 16 + [True] and all(taken[16:])


def auto_drafter(model, text: list[int], gate: str = "measured") -> AutoDrafter:
    sampler = Sampler(SamplingConfig(temperature=0), 0, text, 300, CPU)
    drafter = AutoDrafter(model, sampler, generation_sizer(model, "auto", sampler.config, 8),
                          None, context=256, gate=gate)
    drafter.prefill(text, None)
    return drafter


def step_told_plain(model, text: list[int]) -> int:
    """The nodes of `auto`'s step after `text` when its gate says to take a plain one."""
    drafter = auto_drafter(model, text)
    drafter.gate.choose = lambda: False
    return drafter.propose(text, Budget(8, 4)).n


def test_auto_drafts_where_the_suffix_matches_are_sure_though_its_gate_says_plain(tiny_model):
    """A stretch where the text repeats is drafted at once, not at the gate's next retry."""
    assert step_told_plain(tiny_model, [5, 6, 7, 8] * 12) > 1
    assert step_told_plain(tiny_model, list(range(40, 88))) == 1     # no match: a plain step


def test_auto_with_its_gate_off_drafts_where_nothing_matches(tiny_model):
    text = list(range(40, 88))
    assert auto_drafter(tiny_model, text, gate="off").propose(text, Budget(8, 4)).n > 1

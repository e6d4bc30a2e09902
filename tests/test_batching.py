"""Many generations on one model: batched verification (engine/batching.py) and interleaved streams
each write exactly what the generation writes alone, for every method, greedy and sampled, in
float32, bfloat16 and with int4 weights (the compiled layers' path). One forward over several
generations' trees gives each segment bitwise its forward alone. CI runs the tests marked
`profiles` (the forward over several generations in every dtype, every method batched with int4
weights) under every kernel profile it can emulate (.ci/run)."""

import itertools
from types import SimpleNamespace

import pytest
import torch
from helpers import DEVICE
from test_lossless import METHODS, OPTIONS, SETTINGS, models, prompts
from test_sizing import chain

import longspec
from longspec.cache import StaticCache
from longspec.engine import batching
from longspec.engine.batch_cost import worths
from longspec.many import run_streams
from longspec.models.prefill import prefill
from longspec.models.transformer import Segment
from longspec.step.tree import DraftTree, TreeShape

pytestmark = pytest.mark.usefixtures("costs_that_pay")
DTYPES = ["float32", "bfloat16", "int4"]
PROMPTS = ["def merge_sort(items):", "class LRUCache:\n    def __init__(self, size):",
           "import json\n\ndef load(path):", "for line in open('log.txt'):"]


def prefilled(model, context: int, seed: int) -> StaticCache:
    g = torch.Generator().manual_seed(seed)
    cache = StaticCache(model.config, context + 80, model.dtype, DEVICE)
    ids = torch.randint(0, model.config.vocab_size, (context,), generator=g).to(DEVICE)
    prefill(model.net, ids, cache, 0)
    return cache


@pytest.mark.profiles
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_forward_over_several_generations_gives_each_its_forward_alone(dtype):
    target, _ = models(dtype)
    trees = [[-1], [-1, 0, 1, 2], [-1, 0, 0, 1, 1, 2, 4, 3], [-1, 0, 1]]
    contexts = [5, 300, 257, 40]
    g = torch.Generator().manual_seed(0)
    segments, expected = [], []
    for k, (parents, context) in enumerate(zip(trees, contexts)):
        cache = prefilled(target, context, seed=k)
        shape = TreeShape(parents, torch.device(DEVICE))
        tokens = torch.randint(0, target.config.vocab_size, (shape.n,), generator=g).to(DEVICE)
        segment = Segment(tokens, shape.depth + context, cache, shape.mask(target.dtype))
        expected.append(target.net(segment.tokens, segment.positions, cache, segment.mask,
                                   return_hidden=True))
        segments.append(segment)
    outs = target.net.forward_many(segments, return_hidden=True)
    for k, (out, alone) in enumerate(zip(outs, expected)):
        assert torch.equal(out.logits, alone.logits), f"generation {k}'s logits differ"
        assert torch.equal(out.hidden, alone.hidden), f"generation {k}'s hidden states differ"
        assert torch.equal(out.top_tokens(8), alone.top_tokens(8))     # taken once for all rows


def method_request(entry: str, prompt: str, setting: str, new_tokens: int, dtype: str,
                   demo_eagle) -> longspec.Request:
    _, draft = models(dtype)
    method = entry.split("[")[0]
    return longspec.Request(
        prompt, max_new_tokens=new_tokens, method=method, sampling=SETTINGS[setting], seed=3,
        ignore_eos=True, options=OPTIONS.get(entry),
        draft_model=(draft if longspec.METHODS[method].needs_draft_model
                     or entry == "auto[draft]" else None),
        heads=demo_eagle if entry in ("eagle", "auto[eagle]") else None)


def alone(target, r: longspec.Request) -> list[int]:
    return longspec.generate(target, r.prompt, max_new_tokens=r.max_new_tokens, method="ar",
                             sampling=r.sampling, seed=r.seed, ignore_eos=True).token_ids


def check_batched(dtype: str, setting: str, new_tokens: int, max_batch: int,
                  demo_eagle) -> None:
    """Every method in one batch (a generation joining as another leaves), each prompt in
    turn, against `ar` alone."""
    target, _ = models(dtype)
    texts = itertools.cycle([prompts()["tqdm"][:400], *PROMPTS])
    requests = [method_request(entry, next(texts), setting, new_tokens, dtype, demo_eagle)
                for entry in METHODS]
    streams = [longspec.api.stream_request(target, r) for r in requests]
    for _ in run_streams(target, streams, max_batch):
        pass
    for entry, request, s in zip(METHODS, requests, streams):
        assert s.result.token_ids == alone(target, request), f"{entry} differs"
        assert s.result.finish_reason == "length"
    assert any(s.result.stats["accepted_draft_tokens"] for s in streams)


@pytest.mark.parametrize("setting", [pytest.param("greedy_penalty", marks=pytest.mark.slow),
                                     "sampling_min_p_penalty"])
def test_every_method_in_a_batch_writes_what_it_writes_alone(setting, demo_eagle):
    check_batched("float32", setting, 32, 5, demo_eagle)


def test_a_batch_choosing_its_members_tokens_together_writes_what_each_writes_alone(
        monkeypatch, demo_eagle):
    # every member's rows sampled in one set of operations, one read-back a step: CUDA's way
    together = batching.choices_together
    calls = []
    monkeypatch.setattr(batching, "samples_together", lambda device: True)
    monkeypatch.setattr(batching, "choices_together",
                        lambda *args: calls.append(len(args[0])) or together(*args))
    check_batched("float32", "sampling_min_p_penalty", 16, 5, demo_eagle)
    assert max(calls) == 5


@pytest.mark.slow
# int4 weights sampled with top-p: the fast tier's batch below
@pytest.mark.parametrize("dtype,setting", [("bfloat16", "greedy"), ("bfloat16", "sampling_top_p"),
                                           ("int4", "greedy")])
def test_every_method_in_a_batch_writes_what_it_writes_alone_in(dtype, setting, demo_eagle):
    check_batched(dtype, setting, 32, 6, demo_eagle)


@pytest.mark.profiles
def test_the_fast_tier_batches_bfloat16_and_int4_too(demo_eagle):
    check_batched("int4", "sampling_top_p", 32, 14, demo_eagle)


@pytest.mark.parametrize("method", ["auto", "recycling", "suffix"])
def test_two_streams_interleaved_on_one_model_each_write_what_they_write_alone(method):
    target, _ = models("float32")
    settings = {"max_new_tokens": 64, "method": method, "ignore_eos": True, "seed": 1,
                "sampling": SETTINGS["sampling_min_p_penalty"]}
    first = longspec.stream(target, PROMPTS[0], **settings)
    second = longspec.stream(target, PROMPTS[1], **settings)
    for a, b in itertools.zip_longest(first, second):
        pass
    for s, prompt in ((first, PROMPTS[0]), (second, PROMPTS[1])):
        expect = longspec.generate(target, prompt, **{**settings, "method": "ar"}).token_ids
        assert s.result.token_ids == expect


class Held(batching.StepRates):
    """A gate that always takes one arm."""

    def __init__(self, arm: bool):
        super().__init__()
        self.arm = arm

    def choose(self) -> bool:
        return self.arm


def hold_gate(monkeypatch, drafting: bool, sure: bool = True) -> None:
    """Batches whose gate takes drafting steps only or plain steps only, their members' sure
    drafts in plain steps allowed (as the sure drafts' own gate first does) or not."""
    init = batching.Batch.__init__

    def held(self, model):
        init(self, model)
        self.gate = Held(drafting)
        if not sure:
            self.sure = Held(False)

    monkeypatch.setattr(batching.Batch, "__init__", held)


@pytest.mark.parametrize("sure", [True, False])
def test_a_member_sure_of_its_drafts_drafts_in_the_batchs_plain_steps(monkeypatch, sure):
    """The batch held to plain steps: `auto` still drafts where its suffix matches are sure
    (a text that repeats itself) unless the batch's measure of such drafts says no, the
    others take plain steps, and each writes what it writes alone."""
    hold_gate(monkeypatch, False, sure)
    target, _ = models("float32")
    looping = "one two three four five six. " * 12
    settings = {"max_new_tokens": 48, "ignore_eos": True, "seed": 2, "method": "auto",
                "sampling": SETTINGS["greedy"]}
    results = longspec.generate_many(target, [looping, PROMPTS[0]], max_batch=2, **settings)
    for r, prompt in zip(results, [looping, PROMPTS[0]]):
        expect = longspec.generate(target, prompt, **{**settings, "method": "ar"}).token_ids
        assert r.token_ids == expect
    assert (results[0].stats["accepted_draft_tokens"] > 0) == sure


def test_autos_recycling_matrix_learns_in_the_steps_that_read_it_alone(monkeypatch):
    """Held to the batch's plain steps, `auto` leaves its recycling matrix as it was; in its
    drafting steps the matrix learns. (Sure drafts are held off in the plain steps: one that
    carried a member ahead left the other to step alone, as a generation alone does, with its
    own gate: a batch of one does not take the batch's plain steps.)"""
    target, _ = models("float32")
    settings = {"max_new_tokens": 24, "ignore_eos": True, "seed": 2, "method": "auto",
                "sampling": SETTINGS["greedy"], "options": {"gate": "off"}}

    def matrices_changed() -> list[bool]:
        streams = [longspec.stream(target, p, **settings) for p in PROMPTS[:2]]
        before = [s.engine.drafter.recycling.matrix.clone() for s in streams]
        for _ in run_streams(target, streams, 2):
            pass
        return [not torch.equal(m, s.engine.drafter.recycling.matrix)
                for m, s in zip(before, streams)]

    hold_gate(monkeypatch, True)
    assert matrices_changed() == [True, True]
    hold_gate(monkeypatch, False, sure=False)
    assert matrices_changed() == [False, False]


def test_a_batchs_members_of_one_method_and_setting_learn_one_calibration():
    """What one member's drafts show, the others of its method and sampling setting read at
    the next step; a member of another setting keeps its own."""
    target, _ = models("float32")
    settings = {"max_new_tokens": 8, "method": "auto", "seed": 3}
    streams = [longspec.stream(target, PROMPTS[0], **settings),
               longspec.stream(target, PROMPTS[1], **settings),
               longspec.stream(target, PROMPTS[2], **settings, sampling=SETTINGS["sampling_top_p"])]
    batch = batching.Batch(target)
    for s in streams:
        batch.join(s)
    first, second, other = (s.engine.sizer.calibration for s in streams)
    fresh = other.chance(0, 0.7)
    for _ in range(30):
        first.record(chain(0.7, 1), [0])
    assert second.chance(0, 0.7) == first.chance(0, 0.7) < fresh / 2
    assert other.chance(0, 0.7) == fresh
    batch.close()


def test_a_batch_is_closed_once_no_prompt_waits(monkeypatch):
    """run_streams tells the batch when no prompt waits to join (Batch.closed)."""
    seen = []
    step = batching.Batch.step

    def recorded(self):
        seen.append((len(self), self.closed))
        return step(self)

    monkeypatch.setattr(batching.Batch, "step", recorded)
    target, _ = models("float32")
    longspec.generate_many(target, PROMPTS[:3], max_batch=2, max_new_tokens=8,
                           ignore_eos=True, method="ar")
    # each one's first token taken in its prefill (Engine.first), the 7 others in steps
    assert seen == [(2, False)] * 7 + [(1, True)] * 7


def test_a_closed_batchs_step_is_worth_how_far_it_moved_the_batchs_end():
    batch = batching.Batch(models("float32")[0])
    left, news = [10, 8, 10], [[1], [1, 2, 3], [1, 2]]
    assert batch._worth(left, news) == 6
    batch.closed = True
    assert batch._worth(left, news) == 3        # the end: 10 tokens left, then 9; 3 members


def test_in_a_closed_batch_a_member_ahead_of_its_end_counts_its_tokens_at_their_worth():
    left = [13, 11, 13]
    drafts = [(DraftTree.chain([1, 2], torch.device(DEVICE)), 0.0)] * 3
    cost = SimpleNamespace(ahead_worth=lambda: 0.6)
    assert worths(left, drafts, cost, False) == [1.0, 1.0, 1.0]
    assert worths(left, drafts, cost, True) == [1.0, 0.6, 1.0]


def test_generate_many_keeps_the_prompts_order_and_stream_many_names_each_chunk():
    target, _ = models("float32")
    settings = {"max_new_tokens": 24, "ignore_eos": True, "seed": 2,
                "sampling": SETTINGS["sampling_top_p"]}
    results = longspec.generate_many(target, PROMPTS, max_batch=3, **settings)
    expect = [longspec.generate(target, p, **settings).token_ids for p in PROMPTS]
    assert [r.token_ids for r in results] == expect
    got: dict[int, list[int]] = {}
    for index, chunk in longspec.stream_many(target, PROMPTS, max_batch=2, **settings):
        got.setdefault(index, []).extend(chunk.token_ids)
    assert [got[i] for i in range(len(PROMPTS))] == expect


def test_a_batch_needs_room_for_one_generation():
    target, _ = models("float32")
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        longspec.generate_many(target, PROMPTS, max_batch=0, max_new_tokens=4)


def test_a_bad_prompt_is_refused_when_it_joins_with_the_fix():
    target, _ = models("float32")
    with pytest.raises(ValueError, match="max_new_tokens"):
        longspec.generate_many(target, PROMPTS, max_new_tokens=0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "auto"])
def test_a_long_prompt_joins_a_chunk_a_step_and_every_stream_writes_what_it_writes_alone(
        method):
    """An admitted stream's prefill runs one chunk before each of the batch's steps: the
    running member gets a chunk of tokens from every step while the long prompt joins, and
    each writes what it writes alone."""
    target, _ = models("float32")
    settings = {"max_new_tokens": 24, "ignore_eos": True, "seed": 3, "method": method,
                "sampling": SETTINGS["sampling_top_p"]}
    # a prompt of its own (one another test ran would come from the prompt cache in one piece)
    long_prompt = torch.randint(0, target.config.vocab_size, (1100,), generator=torch.Generator()
                                .manual_seed(len(method))).tolist()
    running = longspec.stream(target, PROMPTS[0], **settings)
    joining = longspec.stream(target, long_prompt, **settings)
    batch = batching.Batch(target)
    batch.join(running)
    batch.admit(joining)
    while_joining = []
    while batch.members or batch.joining:
        was_joining = bool(batch.joining)
        out = batch.step()
        if was_joining and running.result is None:
            while_joining.append([s is running for s, _ in out].count(True))
    assert len(while_joining) >= 2 and all(n == 1 for n in while_joining)
    assert running.result.token_ids == longspec.generate(target, PROMPTS[0],
                                                         **settings).token_ids
    assert joining.result.token_ids == longspec.generate(target, long_prompt,
                                                         **settings).token_ids


def test_a_stream_stopped_while_it_joins_leaves_and_the_batch_goes_on():
    target, _ = models("float32")
    settings = {"max_new_tokens": 12, "ignore_eos": True, "seed": 3, "method": "auto",
                "sampling": SETTINGS["greedy"]}
    running = longspec.stream(target, PROMPTS[1], **settings)
    joining = longspec.stream(target, list(range(50, 650)), **settings)
    batch = batching.Batch(target)
    batch.join(running)
    batch.admit(joining)
    batch.step()
    assert batch.joining and len(batch) == 2
    batch.leave(joining, False)
    batch.leave(joining, False)         # gone already: nothing happens
    assert joining.result.token_ids == [] and joining.result.finish_reason == "interrupted"
    while batch.members:
        batch.step()
    assert running.result.token_ids == longspec.generate(target, PROMPTS[1],
                                                         **settings).token_ids

"""Training drafters: the EAGLE drafter learns and round-trips, an interrupted training
continues to the weights of an uninterrupted one, checkpoints and drafters of other settings or
models are refused, bad settings are named."""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches_ar, make_checkpoint

import longspec
from longspec.cli import main
from longspec.drafters.eagle import EagleDrafter
from longspec.heads import load_eagle, store
from longspec.heads.eagle import PRODUCTS, EagleDrafterNet, FeatureCache
from longspec.models.compiled import int4_mm
from longspec.models.linear import DenseLinear, Int4Linear
from longspec.training import drafters as train_module
from longspec.training.data import TargetFeatures, chat_stream, chat_tokens, data_files
from longspec.training.drafters import (
    DrafterTraining,
    train_drafter,
    training_data,
    training_precision,
)
from longspec.training.objectives import eagle_losses, implied_length

TINY = {"batch_size": 2, "seq_len": 48, "warmup_steps": 2}


def weights(path, kind):
    from safetensors.torch import load_file

    return load_file(str(path / f"{kind}.safetensors"))


def test_eagle_training_lowers_held_out_loss_and_round_trips(tiny_model, text_file, tmp_path):
    cfg = DrafterTraining(kind="eagle", steps=12, lr=1e-2, **TINY)
    record = train_drafter(tiny_model, [text_file], cfg, out=tmp_path, progress=False)
    assert record["held_out_loss_after"] < record["held_out_loss_before"] - 0.1
    assert record["agreement_after"][0] > record["agreement_before"][0]
    saved = json.loads((tmp_path / "eagle.json").read_text())
    assert saved["training"]["steps"] == 12 and saved["format"] == 2
    assert len(saved["loss_curve"]) == 12 and saved["data"] == [str(text_file)]
    drafter = load_eagle(tmp_path, tiny_model)
    # saved in bfloat16, loaded into the model's dtype
    assert all(torch.equal(drafter.state_dict()[k], v.to(drafter.state_dict()[k].dtype))
               for k, v in weights(tmp_path, "eagle").items())
    assert not (tmp_path / "eagle.checkpoint.pt").exists()


@pytest.mark.parametrize("kind", [pytest.param("eagle", marks=pytest.mark.slow), "heads"])
def test_interrupted_training_continues_to_the_same_weights(tiny_model, text_file, tmp_path,
                                                            kind):
    cfg = DrafterTraining(kind=kind, steps=6, checkpoint_every=2, **TINY)
    whole = train_drafter(tiny_model, [text_file], cfg, out=tmp_path / "whole", progress=False)
    part = train_drafter(tiny_model, [text_file], cfg, out=tmp_path / "part", progress=False,
                         stop_after=3)
    assert not part["finished"] and (tmp_path / "part" / f"{kind}.checkpoint.pt").is_file()
    rest = train_drafter(tiny_model, [text_file], cfg, out=tmp_path / "part", progress=False)
    assert rest["loss_curve"] == whole["loss_curve"]
    assert rest["held_out_loss_after"] == whole["held_out_loss_after"]
    a, b = weights(tmp_path / "whole", kind), weights(tmp_path / "part", kind)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow      # keeps the fast tier under five minutes
def test_training_in_bfloat16_learns_and_says_so(tiny_model, text_file, tmp_path):
    cfg = DrafterTraining(kind="eagle", steps=12, lr=1e-2, precision="bfloat16", **TINY)
    record = train_drafter(tiny_model, [text_file], cfg, out=tmp_path, progress=False)
    assert record["held_out_loss_after"] < record["held_out_loss_before"] - 0.1
    assert record["training"]["precision"] == "bfloat16"
    # a checkpoint of one precision is not continued in another
    train_drafter(tiny_model, [text_file], replace(cfg, steps=4), out=tmp_path / "part",
                  progress=False, stop_after=1)
    with pytest.raises(ValueError, match="checkpoint of another training.*precision"):
        train_drafter(tiny_model, [text_file], replace(cfg, steps=4, precision="float32"),
                      out=tmp_path / "part", progress=False)


@pytest.mark.parametrize(("isa", "expected"), [("AVX2", "float32"), ("AVX512", "float32"),
                                               ("AVX512_BF16", "bfloat16"), ("AMX", "bfloat16")])
def test_auto_precision_is_bfloat16_where_the_cpu_multiplies_it(monkeypatch, isa, expected):
    monkeypatch.setattr(train_module, "cpu_isa", lambda: isa)
    assert training_precision("auto", torch.device("cpu")) == expected
    assert training_precision("float32", torch.device("cpu")) == "float32"
    with pytest.raises(ValueError, match="precision must be one of auto, float32, bfloat16"):
        DrafterTraining(precision="fp8").validate()


def test_checkpoint_of_other_settings_is_refused(tiny_model, text_file, tmp_path):
    cfg = DrafterTraining(kind="eagle", steps=4, **TINY)
    train_drafter(tiny_model, [text_file], cfg, out=tmp_path, progress=False, stop_after=1)
    other = DrafterTraining(kind="eagle", steps=4, lr=1e-2, **TINY)
    with pytest.raises(ValueError, match="checkpoint of another training.*lr"):
        train_drafter(tiny_model, [text_file], other, out=tmp_path, progress=False)
    # the heads kind has its own checkpoint beside it
    train_drafter(tiny_model, [text_file], DrafterTraining(kind="heads", steps=1, **TINY),
                  out=tmp_path, progress=False)


def test_eagle_drafter_for_another_model_is_refused(tiny_model, text_file, tmp_path,
                                                     tmp_path_factory):
    train_drafter(tiny_model, [text_file], DrafterTraining(kind="eagle", steps=1, **TINY),
                  out=tmp_path, progress=False)
    other_dir = tmp_path_factory.mktemp("other")
    make_checkpoint(other_dir, "llama", vocab=300, max_positions=256, seed=7)
    other = longspec.load_model(other_dir, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="trained for another model"):
        load_eagle(tmp_path, other)
    with pytest.raises(ValueError, match="trained for another model"):
        longspec.generate(other, [1, 2, 3], max_new_tokens=2, method="eagle", heads=tmp_path)
    with pytest.raises(ValueError, match="needs an EAGLE drafter: pass "
                       "heads=PATH .* or run 'longspec train-drafter MODEL --kind eagle"):
        longspec.generate(other, [1, 2, 3], max_new_tokens=2, method="eagle")


def test_a_heads_directory_given_to_eagle_says_what_it_holds(tiny_model, text_file, tmp_path):
    train_drafter(tiny_model, [text_file], DrafterTraining(kind="heads", steps=1, **TINY),
                  out=tmp_path, progress=False)
    with pytest.raises(ValueError, match="holds no eagle drafter.*of kind 'heads'"):
        load_eagle(tmp_path, tiny_model)


def test_kind_and_settings_are_validated(tiny_model, text_file, capsys):
    with pytest.raises(ValueError, match="kind must be one of eagle, heads"):
        DrafterTraining(kind="medusa").validate()
    with pytest.raises(ValueError, match="lr must be a positive number"):
        DrafterTraining(lr=-1.0).validate()
    with pytest.raises(SystemExit) as exit_:
        main(["train-drafter", "demo", "--kind", "medusa", "--data", str(text_file),
              "--out", "x"])
    assert exit_.value.code == 2 and "invalid choice: 'medusa'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train-drafter", "demo", "--data", str(text_file), "--out", "x"])
    assert "--kind" in capsys.readouterr().err


def test_data_directories_expand_to_their_text_files(tmp_path):
    (tmp_path / "pkg" / "tests").mkdir(parents=True)
    for name in ("pkg/a.py", "pkg/b.md", "pkg/tests/t.py", "pkg/c.bin"):
        (tmp_path / name).write_text("x = 1\n")
    (tmp_path / "pkg" / "latin.py").write_bytes(b"\xe9\xff")
    assert data_files([tmp_path]) == [tmp_path / "pkg" / "a.py", tmp_path / "pkg" / "b.md"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .py"):
        data_files([tmp_path / "empty"])


def test_training_needs_a_tokenizer(tiny_model_dir, text_file):
    model = longspec.load_model(tiny_model_dir, dtype="float32", device="cpu")
    model.tokenizer = None
    with pytest.raises(ValueError, match="no tokenizer"):
        train_drafter(model, [text_file], DrafterTraining(steps=1, **TINY), progress=False)


@pytest.mark.slow      # keeps the fast tier under five minutes
def test_ctrl_c_leaves_a_checkpoint_that_continues_the_run(tiny_model, text_file, tmp_path,
                                                           monkeypatch):
    from longspec.training import drafters as train

    cfg = DrafterTraining(kind="eagle", steps=5, checkpoint_every=100, **TINY)
    whole = train_drafter(tiny_model, [text_file], cfg, out=tmp_path / "whole", progress=False)
    real, calls = train.sample_windows, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 4 + train.EVAL_BATCHES:     # the before-evaluation's, then 3 steps
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(train, "sample_windows", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(tiny_model, [text_file], cfg, out=tmp_path / "part", progress=False)
    monkeypatch.setattr(train, "sample_windows", real)
    rest = train_drafter(tiny_model, [text_file], cfg, out=tmp_path / "part", progress=False)
    assert rest["loss_curve"] == whole["loss_curve"]
    a, b = weights(tmp_path / "whole", "eagle"), weights(tmp_path / "part", "eagle")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow      # keeps the fast tier under five minutes
def test_eagle_with_a_draft_vocabulary_learns_guesses_only_frequent_tokens_and_is_exact(
        tiny_model, text_file, tmp_path):
    cfg = DrafterTraining(kind="eagle", steps=12, lr=1e-2, draft_vocab=24, **TINY)
    record = train_drafter(tiny_model, [text_file], cfg, out=tmp_path, progress=False)
    assert record["held_out_loss_after"] < record["held_out_loss_before"] - 0.1
    drafter = load_eagle(tmp_path, tiny_model)
    text = text_file.read_text()
    vocab = drafter.vocab.tolist()
    assert vocab == sorted(set(vocab)) and len(vocab) == 24
    # the map back: token id -> draft index -> token id; -1 outside the draft vocabulary
    every = torch.arange(tiny_model.config.vocab_size)
    index = drafter.draft_index(every, tiny_model.config.vocab_size)
    assert torch.equal(drafter.vocab[index[drafter.vocab]], drafter.vocab)
    assert torch.equal(index[drafter.vocab], torch.arange(24))
    assert (index >= 0).sum() == 24
    assert set(vocab) <= set(text.encode()) and {ord(" "), ord("o"), ord("e")} <= set(vocab)
    prompt = list(text[:40].encode())
    sampling = longspec.SamplingConfig(temperature=0)
    res = assert_matches_ar(tiny_model, prompt, "eagle", 40, options={"sizing": "fixed"},
                            heads=tmp_path, sampling=sampling)
    assert res.stats["accepted_draft_tokens"] > 0


def test_a_narrow_drafter_trained_into_the_user_directory_is_found(tiny_model, text_file,
                                                                  tmp_path, monkeypatch):
    monkeypatch.setenv("LONGSPEC_HOME", str(tmp_path))
    cfg = DrafterTraining(kind="eagle", steps=2, eagle_mlp=16, **TINY)
    train_drafter(tiny_model, [text_file], cfg, out=store.user_dir(tiny_model), progress=False)
    assert json.loads((store.user_dir(tiny_model) / "eagle.json").read_text())[
        "intermediate_size"] == 16
    assert load_eagle(store.user_dir(tiny_model), tiny_model).w_down.in_features == 16
    prompt = list(text_file.read_text()[:40].encode())
    res = assert_matches_ar(tiny_model, prompt, "eagle", 24, options={"sizing": "fixed"},
                            sampling=longspec.SamplingConfig(temperature=0))
    assert res.stats["drafted_tokens"] > 0
    left_out = assert_matches_ar(tiny_model, prompt, "auto", 24,
                                 options={"drafter": "none", "gate": "off"})
    assert left_out.stats["sources"]["eagle"]["verified"] == 0
    with pytest.raises(ValueError, match="eagle_mlp must be 0"):
        DrafterTraining(eagle_mlp=-1).validate()


def test_draft_vocabulary_must_not_be_negative():
    with pytest.raises(ValueError, match="draft_vocab must be 0"):
        DrafterTraining(draft_vocab=-1).validate()


def test_unrolled_training_sees_what_drafting_sees(tiny_model):
    """Step k of the training-time test at index i computes what drafting computes for the
    depth-k node after the root at position i + 1: the committed pairs' keys, its ancestors'
    and its own."""
    torch.manual_seed(0)
    eagle = EagleDrafterNet.for_model(tiny_model)
    for p in eagle.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.1)
    tokens = torch.randint(0, tiny_model.config.vocab_size, (1, 12))
    features = torch.randn(1, 12, tiny_model.config.hidden_size)
    embeds = F.embedding(tokens, tiny_model.net.embed).float()
    unrolled = eagle.unroll(embeds, features, 3)
    i = 5
    root = i + 1
    cache = FeatureCache(eagle.shape, 32, torch.float32, "cpu")
    causal = torch.full((root, root), float("-inf")).triu(1)
    guess = eagle(embeds[0, 1:root + 1], features[0, :root], torch.arange(1, root + 1), cache, 0,
                  causal)[-1:]
    torch.testing.assert_close(guess[0], unrolled[0][0, i])
    for depth in (1, 2):            # a chain: each node sees everything before it
        slot = root + depth - 1
        guess = eagle(embeds[0, root + depth:root + depth + 1], guess,
                      torch.tensor([root + depth]), cache, slot, torch.zeros(1, slot + 1))
        torch.testing.assert_close(guess[0], unrolled[depth][0, i])


def test_the_drafting_copy_guesses_as_the_trained_drafter(tiny_model):
    """Drafting runs a copy whose products are the model's own product modules (8-bit on
    longspec::int4_mm where it runs); the trained drafter keeps its own, and the copy's
    guesses and logits are the trained ones up to the rounding of its weights."""
    torch.manual_seed(0)
    eagle = EagleDrafterNet.for_model(tiny_model)
    for p in eagle.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.1)
    drafting, head = eagle.for_drafting(tiny_model.net)
    assert isinstance(eagle.wqkv, torch.nn.Linear)
    product = Int4Linear if int4_mm() else DenseLinear
    assert all(isinstance(getattr(drafting, n), product) for n in PRODUCTS)
    tokens = torch.randint(0, tiny_model.config.vocab_size, (6,))
    features = torch.randn(6, tiny_model.config.hidden_size)
    embeds = F.embedding(tokens, tiny_model.net.embed)
    causal = torch.full((6, 6), float("-inf")).triu(1)
    guesses = [net(embeds, features, torch.arange(6), FeatureCache(eagle.shape, 8,
                                                                   torch.float32, "cpu"),
                   0, causal) for net in (eagle, drafting)]
    torch.testing.assert_close(guesses[1], guesses[0], atol=0.05, rtol=0.05)
    torch.testing.assert_close(head(guesses[1]), F.linear(guesses[1], eagle.head(tiny_model.net)),
                               atol=0.05, rtol=0.05)


def test_auto_drafts_with_eagle_only_where_the_suffix_matches_are_unsure(demo_eagle,
                                                                         monkeypatch):
    """In `auto`, the EAGLE drafter runs in the steps where the suffix matches' next token is
    unsure; the steps it skips reach its feature cache later, and the text is `ar`'s."""
    model = longspec.load_model("demo", dtype="float32", device="cpu")
    calls = []
    drafts = EagleDrafter.add_drafts
    monkeypatch.setattr(EagleDrafter, "add_drafts",
                        lambda self, *args: calls.append(len(args[1])) or drafts(self, *args))
    prompt = "import os\n" + "def add(a, b):\n    return a + b\n\n" * 12
    sampling = longspec.SamplingConfig(temperature=0)
    res = assert_matches_ar(model, prompt, "auto", 96, heads=demo_eagle, sampling=sampling)
    assert 0 < len(calls) < res.stats["steps"]


def test_training_time_test_lowers_held_out_loss_at_depth_2(tiny_model, text_file, tmp_path):
    """Trained over its own guesses (3 steps), the drafter guesses better at depth 2 than one
    trained at depth 1 only, on held-out windows."""
    losses = {}
    for steps in (1, 3):
        cfg = DrafterTraining(kind="eagle", steps=40, lr=1e-2, ttt_steps=steps, target="text",
                              **TINY)
        train_drafter(tiny_model, [text_file], cfg, out=tmp_path / str(steps), progress=False)
        eagle = load_eagle(tmp_path / str(steps), tiny_model).float()
        _, held, _ = training_data(tiny_model, [text_file], cfg)
        batch = TargetFeatures(tiny_model, held, TINY["seq_len"]).batch(torch.arange(2), False)
        with torch.no_grad():
            per_step, _ = eagle_losses(eagle, tiny_model, batch, replace(cfg, ttt_steps=2))
        losses[steps] = per_step[1].item()
    assert losses[3] < losses[1]


@pytest.mark.slow      # keeps the fast tier under five minutes
def test_eagle_report_gives_acceptance_per_depth(tiny_model, text_file, tmp_path, capsys,
                                                monkeypatch):
    from longspec.cli import train as train_cli

    cfg = DrafterTraining(kind="eagle", steps=10, lr=1e-2, **TINY)
    record = train_drafter(tiny_model, [text_file], cfg, out=tmp_path, progress=False)
    rates = record["held_out_acceptance"]
    assert rates["depths"] == 6 and rates["answer_tokens"] > 0
    for kind in ("greedy", "greedy_top8", "sampled"):
        assert len(rates[kind]) == 6 and all(0 <= r <= 1 for r in rates[kind])
        assert rates[f"{kind}_mean_accepted"] == implied_length(rates[kind])
    assert rates["greedy_top8"][0] >= rates["greedy"][0]
    assert implied_length([0.5, 0.5]) == 1.75
    monkeypatch.setattr(train_cli, "load_from_args", lambda name, args: tiny_model)
    assert main(["train-drafter", "tiny", "--kind", "eagle", "--data", str(text_file),
                 "--out", str(tmp_path), "--report", "--seq-len", "48", "--no-progress"]) == 0
    assert "held-out acceptance per depth" in capsys.readouterr().out


class ChatTokenizer:
    """A tokenizer whose chat template writes "<role>content|" one byte a token."""

    chat_template = "<role>content|"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True,
                            return_dict=False):
        text = "".join(f"<{m['role']}>{m['content']}|" for m in messages)
        return list((text + ("<assistant>" if add_generation_prompt else "")).encode())


def test_chat_tokens_mark_the_answers_only():
    model = SimpleNamespace(tokenizer=ChatTokenizer(), name="chat")
    ids, answer = chat_tokens(model, [("system", "be brief"), ("human", "hi"), ("gpt", "hello"),
                                      ("human", "more"), ("gpt", "ok"), ("other", "skipped")])
    text = bytes(ids).decode()
    assert text == "<system>be brief|<user>hi|<assistant>hello|<user>more|<assistant>ok|"
    marked = "".join(c for c, a in zip(text, answer) if a)
    assert marked == "hello|ok|"
    assert chat_tokens(model, [("human", "no answer")]) is None
    stream = chat_stream(model, [[("human", "a"), ("gpt", "b")]] * 5, max_tokens=50)
    assert len(stream) == 50 and stream.answer.sum() == 2 * 2     # two and a cut third


def test_an_eagle_drafter_of_an_earlier_format_is_refused(tiny_model, text_file, tmp_path):
    train_drafter(tiny_model, [text_file], DrafterTraining(kind="eagle", steps=1, **TINY),
                  out=tmp_path, progress=False)
    meta = json.loads((tmp_path / "eagle.json").read_text())
    (tmp_path / "eagle.json").write_text(json.dumps({**meta, "format": 1}))
    with pytest.raises(ValueError, match="format 1, made by an earlier longspec.*train"):
        load_eagle(tmp_path, tiny_model)

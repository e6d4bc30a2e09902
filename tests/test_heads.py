"""Multi-token heads: training lowers held-out loss, save/load round trip, per-head output
norms (and the first format, without them, still loads), mismatches rejected."""

import json

import pytest
import torch
from helpers import make_checkpoint

import longspec
from longspec.heads import MultiTokenHeads, load_heads
from longspec.training.drafters import DrafterTraining, train_drafter


def heads_training(**settings) -> DrafterTraining:
    return DrafterTraining(kind="heads", **settings)


def test_heads_chain_residual_blocks():
    heads = MultiTokenHeads(8, gamma=3)
    h0 = torch.randn(2, 8)
    outs = heads(h0)
    assert len(outs) == 3 and all(torch.equal(o, h0) for o in outs)   # zero-initialised
    with torch.no_grad():
        heads.proj[0].weight.normal_()
    outs = heads(h0)
    expect = h0 + (torch.nn.functional.rms_norm(h0, (8,), heads.norms[0], heads.eps)
                   @ heads.proj[0].weight.T)
    assert torch.allclose(outs[0], expect, atol=1e-6)
    assert torch.allclose(outs[1], outs[0], atol=1e-6)   # head 2 adds zero


@pytest.mark.parametrize("target", ["text", "distill"])
def test_train_heads_lowers_held_out_loss_and_round_trips(tiny_model, text_file, tmp_path,
                                                          target):
    cfg = heads_training(steps=12, batch_size=2, seq_len=64, lr=1e-2, warmup_steps=2,
                         target=target)
    record = train_drafter(tiny_model, [text_file], cfg, out=tmp_path, progress=False)
    assert record["held_out_loss_after"] < record["held_out_loss_before"] - 0.1
    assert len(record["agreement_after"]) == 3
    heads = load_heads(tmp_path, tiny_model)
    assert heads.gamma == 3
    h = torch.randn(1, tiny_model.config.hidden_size)
    assert heads.logits(tiny_model.net, h).shape == (3, 1, 300)
    # each head's output norm started as the final norm and learned its own weight
    final = tiny_model.net.norm
    assert all(not torch.equal(norm, final) for norm in heads.out_norms)
    assert json.loads((tmp_path / "heads.json").read_text())["format"] == 2


def test_save_load_round_trip_keeps_weights_in_bfloat16(tiny_model, tmp_path):
    heads = MultiTokenHeads(tiny_model.config.hidden_size, gamma=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_()
    heads.save(tmp_path, tiny_model)
    loaded = load_heads(tmp_path, tiny_model)
    assert loaded.gamma == 2
    assert all(torch.equal(a.bfloat16().float(), b) for a, b in
               zip(heads.state_dict().values(), loaded.state_dict().values()))


def test_first_format_heads_load_with_the_final_norm_and_behave_as_before():
    model = longspec.load_model("demo", dtype="float32", device="cpu")
    heads = load_heads(longspec.heads.store.find_bundled(model, "heads"), model)   # format 1
    net = model.net
    assert all(torch.equal(norm, net.norm) for norm in heads.out_norms)
    h0 = torch.randn(2, model.config.hidden_size) * 30
    before = net.hidden_to_logits(torch.cat(heads(h0))).view(3, 2, -1)   # the old path
    assert torch.equal(heads.logits(net, h0), before)


def test_heads_for_another_model_are_rejected(tiny_model, text_file, tmp_path,
                                              tmp_path_factory):
    cfg = heads_training(steps=1, batch_size=1, seq_len=32, warmup_steps=1)
    train_drafter(tiny_model, [text_file], cfg, out=tmp_path, progress=False)
    other_dir = tmp_path_factory.mktemp("other")
    make_checkpoint(other_dir, "llama", vocab=300, max_positions=256, seed=7)
    other = longspec.load_model(other_dir, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="trained for another model"):
        load_heads(tmp_path, other)
    with pytest.raises(ValueError, match="holds no heads"):
        load_heads(tmp_path / "nothing", tiny_model)
    with pytest.raises(ValueError, match="needs multi-token heads"):
        longspec.generate(other, [1, 2, 3], max_new_tokens=2, method="tokenswift")


def test_heads_load_in_another_dtype_of_the_same_model(tiny_model, tiny_model_dir, text_file,
                                                       tmp_path):
    train_drafter(tiny_model, [text_file],
                  heads_training(steps=1, batch_size=1, seq_len=32, warmup_steps=1),
                  out=tmp_path, progress=False)
    bf16 = longspec.load_model(tiny_model_dir, dtype="bfloat16", device="cpu")
    assert load_heads(tmp_path, bf16).proj[0].weight.dtype == torch.bfloat16


def test_train_heads_bad_input(tiny_model, text_file, tmp_path):
    with pytest.raises(ValueError, match="not found"):
        train_drafter(tiny_model, [tmp_path / "missing.txt"], heads_training(), progress=False)
    with pytest.raises(ValueError, match="target"):
        train_drafter(tiny_model, [text_file], heads_training(target="guess"), progress=False)

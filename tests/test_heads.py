"""Multi-token heads: training lowers held-out loss, save/load round trip, mismatches rejected."""

import pytest
import torch
from helpers import make_checkpoint

import longspec
from longspec.heads import MultiTokenHeads, load_heads
from longspec.heads.train import HeadsTraining, train_heads


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base")
    make_checkpoint(path, "llama", vocab=300, max_positions=256)
    return path


@pytest.fixture(scope="module")
def model(model_dir):
    m = longspec.load_model(model_dir, dtype="float32", device="cpu")
    m.tokenizer = ByteTokenizer()
    return m


class ByteTokenizer:
    """Enough of a tokenizer for training on text: bytes as ids."""

    eos_token_id = None

    def __call__(self, text):
        return {"input_ids": list(text.encode())}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    return path


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
def test_train_heads_lowers_held_out_loss_and_round_trips(model, data_file, tmp_path, target):
    cfg = HeadsTraining(steps=12, batch_size=2, seq_len=64, lr=1e-2, warmup_steps=2, target=target)
    record = train_heads(model, [data_file], cfg, out=tmp_path, progress=False)
    assert record["held_out_loss_after"] < record["held_out_loss_before"] - 0.1
    heads = load_heads(tmp_path, model)
    assert heads.gamma == 3
    h = torch.randn(1, model.config.hidden_size)
    assert heads.logits(model.net, h).shape == (3, 1, 300)


def test_save_load_round_trip_keeps_weights(model, tmp_path):
    heads = MultiTokenHeads(model.config.hidden_size, gamma=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_()
    heads.save(tmp_path, model)
    loaded = load_heads(tmp_path, model)
    assert loaded.gamma == 2
    assert all(torch.equal(a, b) for a, b in zip(heads.state_dict().values(),
                                                 loaded.state_dict().values()))


def test_heads_for_another_model_are_rejected(model, data_file, tmp_path, tmp_path_factory):
    cfg = HeadsTraining(steps=1, batch_size=1, seq_len=32, warmup_steps=1)
    train_heads(model, [data_file], cfg, out=tmp_path, progress=False)
    other_dir = tmp_path_factory.mktemp("other")
    make_checkpoint(other_dir, "llama", vocab=300, max_positions=256, seed=7)
    other = longspec.load_model(other_dir, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="trained for another model"):
        load_heads(tmp_path, other)
    with pytest.raises(ValueError, match="holds no heads"):
        load_heads(tmp_path / "nothing", model)
    with pytest.raises(ValueError, match="needs multi-token heads"):
        longspec.generate(other, [1, 2, 3], max_new_tokens=2, method="tokenswift")


def test_heads_load_in_another_dtype_of_the_same_model(model, model_dir, data_file, tmp_path):
    train_heads(model, [data_file],
                HeadsTraining(steps=1, batch_size=1, seq_len=32, warmup_steps=1),
                out=tmp_path, progress=False)
    bf16 = longspec.load_model(model_dir, dtype="bfloat16", device="cpu")
    assert load_heads(tmp_path, bf16).proj[0].weight.dtype == torch.bfloat16


def test_train_heads_bad_input(model, data_file, tmp_path):
    with pytest.raises(ValueError, match="not found"):
        train_heads(model, [tmp_path / "missing.txt"], HeadsTraining(), progress=False)
    with pytest.raises(ValueError, match="target"):
        train_heads(model, [data_file], HeadsTraining(target="guess"), progress=False)

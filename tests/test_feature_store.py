"""The target's features kept on disk: written in shards as the pass goes, read back bit for
bit, an interrupted pass continued from its last shard, shared by the trainings that follow."""

import pytest
import torch

from longspec.training import data as data_module
from longspec.training.data import FEATURES, TargetFeatures, features_dirs, read_token_stream
from longspec.training.drafters import DrafterTraining, features_only, train_drafter

SEQ = 48
TINY = {"batch_size": 2, "seq_len": SEQ, "warmup_steps": 2}


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(data_module, "SHARD_TOKENS", 3 * SEQ)      # 3 windows a shard


@pytest.fixture
def stream(tiny_model, text_file):
    return read_token_stream(tiny_model, [text_file])


def counted_forwards(monkeypatch, model, stop_at: int | None = None) -> list:
    """Count the target's forwards (and raise KeyboardInterrupt at forward `stop_at`)."""
    net, calls = model.net, []
    real = type(net).forward

    def forward(self, *args, **kwargs):
        calls.append(1)
        if stop_at is not None and len(calls) == stop_at:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(net), "forward", forward)
    return calls


def test_features_round_trip_bit_for_bit(tiny_model, stream, tmp_path, small_shards,
                                         monkeypatch):
    alone = TargetFeatures(tiny_model, stream, SEQ)
    kept = TargetFeatures(tiny_model, stream, SEQ, keep=tmp_path)
    count = len(stream) // SEQ
    assert len(list(tmp_path.glob("part-*.pt"))) == -(-count // 3)
    assert not list(tmp_path.glob("*.tmp"))
    calls = counted_forwards(monkeypatch, tiny_model)
    read = TargetFeatures(tiny_model, stream, SEQ, keep=tmp_path)
    assert not calls
    assert torch.equal(read.hidden, alone.hidden) and torch.equal(kept.hidden, alone.hidden)
    assert read.hidden.dtype == tiny_model.net.dtype


def test_an_interrupted_pass_continues_from_its_last_shard(tiny_model, stream, tmp_path,
                                                           small_shards, monkeypatch):
    whole = TargetFeatures(tiny_model, stream, SEQ)
    counted_forwards(monkeypatch, tiny_model, stop_at=8)          # in the third shard
    with pytest.raises(KeyboardInterrupt):
        TargetFeatures(tiny_model, stream, SEQ, keep=tmp_path)
    assert len(list(tmp_path.glob("part-*.pt"))) == 2
    monkeypatch.undo()
    monkeypatch.setattr(data_module, "SHARD_TOKENS", 3 * SEQ)
    calls = counted_forwards(monkeypatch, tiny_model)
    rest = TargetFeatures(tiny_model, stream, SEQ, keep=tmp_path)
    assert len(calls) == len(stream) // SEQ - 6
    assert torch.equal(rest.hidden, whole.hidden)


def test_a_shard_of_other_windows_is_computed_again(tiny_model, stream, tmp_path, small_shards,
                                                    monkeypatch):
    TargetFeatures(tiny_model, stream, SEQ, keep=tmp_path)
    # the same data shifted by one token: no window is the same, no shard is read
    shifted = stream.split(1)[1]
    calls = counted_forwards(monkeypatch, tiny_model)
    TargetFeatures(tiny_model, shifted, SEQ, keep=tmp_path)
    assert len(calls) == len(shifted) // SEQ
    # a stream that starts with the same windows reads their shards
    calls.clear()
    TargetFeatures(tiny_model, stream.split(7 * SEQ)[0], SEQ, keep=tmp_path / "short")
    calls.clear()
    longer = TargetFeatures(tiny_model, stream.split(10 * SEQ)[0], SEQ, keep=tmp_path / "short")
    assert len(calls) == 4       # shards 0-1 read; shard 2 held windows 6 only, now 6-8; and 9
    assert longer.hidden.shape[0] == 10


def test_features_only_then_both_kinds_train_without_the_pass(tiny_model, text_file, tmp_path,
                                                              monkeypatch):
    cfg = DrafterTraining(kind="heads", steps=2, **TINY)
    done = features_only(tiny_model, [text_file], cfg, tmp_path, progress=False)
    assert done["bytes"] > 0 and done["tokens"] >= sum(done["windows"]) * SEQ
    calls = counted_forwards(monkeypatch, tiny_model)
    train_drafter(tiny_model, [text_file], cfg, out=tmp_path, progress=False,
                  keep_features=True)
    assert all(d.is_dir() for d in features_dirs(tmp_path).values())
    train_drafter(tiny_model, [text_file], DrafterTraining(kind="eagle", steps=2, **TINY),
                  out=tmp_path, progress=False)
    assert not calls
    assert not any(d.exists() for d in features_dirs(tmp_path).values())
    assert (tmp_path / "heads.json").is_file() and (tmp_path / "eagle.json").is_file()
    assert FEATURES.format(part="train") == "features-train"

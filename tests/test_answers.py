"""Self-distillation data: the model's own chat answers, written as the text of the whole
conversation (template and special tokens included), kept when already there."""

import pytest

import longspec
from longspec.cli import main
from longspec.heads.answers import read_instructions, write_answers
from longspec.request import encode_prompt

TEMPLATE = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}\n"
            "{% endfor %}{% if add_generation_prompt %}<|endoftext|>assistant: {% endif %}")
GREEDY = longspec.SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def chat_demo():
    model = longspec.load_model("demo", dtype="float32", device="cpu")
    model.tokenizer.chat_template = TEMPLATE
    return model


def test_answers_hold_the_conversation_and_are_kept(chat_demo, tmp_path,
                                                               monkeypatch):
    asks = ["Write a function that adds two numbers.", "Explain what a list is."]
    paths = write_answers(chat_demo, asks, tmp_path, max_new_tokens=12, sampling=GREEDY,
                          progress=False)
    assert [p.name for p in paths] == ["answer-0000.txt", "answer-0001.txt"]
    for ask, path in zip(asks, paths):
        ids = encode_prompt(chat_demo, [{"role": "user", "content": ask}])
        res = longspec.generate(chat_demo, ids, max_new_tokens=12, sampling=GREEDY)
        text = chat_demo.tokenizer.decode(ids + res.token_ids, skip_special_tokens=False)
        assert path.read_text() == text and text.startswith("<|endoftext|>user: ")
    paths[1].unlink()
    written = []
    real = longspec.api.generate

    def counting(*args, **kwargs):
        written.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(longspec.api, "generate", counting)
    write_answers(chat_demo, asks, tmp_path, max_new_tokens=12, sampling=GREEDY,
                  progress=False)
    assert len(written) == 1 and paths[1].is_file()


def test_instructions_file_needs_one_instruction_per_line(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match="holds no instructions"):
        read_instructions(empty)
    assert main(["answers", "demo", "--instructions", str(tmp_path), "--out",
                 str(tmp_path / "out")]) == 2
    assert "is a directory" in capsys.readouterr().err

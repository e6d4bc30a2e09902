"""Self-distillation data: the model's own chat answers, written as the text of the whole
conversation (template and special tokens included), or as ShareGPT conversations that stand
in for the ones they answer; kept when already there."""

import json

import pytest

import longspec
from longspec.cli import main
from longspec.request import encode_prompt
from longspec.training.answers import (
    MAX_QUESTION_CHARS,
    read_instructions,
    read_sharegpt_answers,
    write_answers,
    write_sharegpt_answers,
)
from longspec.training.drafters import DrafterTraining, training_data
from longspec.zoo import sharegpt

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


def test_answers_to_sharegpt_questions_stand_in_for_their_conversations(chat_demo, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("LONGSPEC_HOME", str(tmp_path / "home"))
    # a template whose conversations render as sequences of prefixes, as chat_tokens needs
    monkeypatch.setattr(chat_demo.tokenizer, "chat_template", TEMPLATE.replace(": ", ":\n"))
    turns = [("human", "x" * (MAX_QUESTION_CHARS + 1)), ("gpt", "too long to ask")]
    records = [[("gpt", "opens with an answer")], turns] + [
        [("human", f"What is {i} plus {i}?"), ("gpt", f"It is {2 * i}."),
         ("human", "Sure?"), ("gpt", "Yes.")] for i in range(80)]
    data = tmp_path / "home" / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    data.parent.mkdir(parents=True)
    data.write_text(json.dumps([{"id": f"c{i}_0", "conversations": [
        {"from": who, "value": text} for who, text in t]} for i, t in enumerate(records)]))
    out = tmp_path / "answers"
    paths = write_sharegpt_answers(chat_demo, 3, out, max_new_tokens=8, sampling=GREEDY,
                                   progress=False)
    assert [p.name for p in paths] == ["sharegpt-00002.json", "sharegpt-00003.json",
                                       "sharegpt-00004.json"]
    ids = encode_prompt(chat_demo, [{"role": "user", "content": "What is 0 plus 0?"}])
    res = longspec.generate(chat_demo, ids, max_new_tokens=8, sampling=GREEDY, seed=2)
    answer = chat_demo.tokenizer.decode(res.token_ids, skip_special_tokens=True)
    assert json.loads(paths[0].read_text()) == {
        "id": "c2_0", "turns": [["human", "What is 0 plus 0?"], ["gpt", answer]]}
    answers = read_sharegpt_answers(out)
    assert sorted(answers) == ["c2_0", "c3_0", "c4_0"]
    assert answers["c3_0"] == [("human", "What is 1 plus 1?"),
                               ("gpt", json.loads(paths[1].read_text())["turns"][1][1])]
    with pytest.raises(ValueError, match="holds no answers"):
        read_sharegpt_answers(tmp_path)
    # conversation c50 is held out (the split by conversation), c2-c4 are not
    assert [sharegpt.held_out(sharegpt.Conversation(f"c{i}_0", [])) for i in (2, 3, 4, 50)] == [
        False, False, False, True]
    cfg = DrafterTraining(sharegpt=20_000, seq_len=8, answers=str(out)).validate()
    train, held, source = training_data(chat_demo, [], cfg)
    text = chat_demo.tokenizer.decode(train.ids.tolist())
    assert answer in text and "It is 0." not in text and "It is 10." in text
    assert "It is 96." in chat_demo.tokenizer.decode(held.ids.tolist())
    assert "the model's answers to 3 of its questions" in source[0]
    with pytest.raises(ValueError, match="give --sharegpt TOKENS with --answers"):
        DrafterTraining(answers=str(out)).validate()

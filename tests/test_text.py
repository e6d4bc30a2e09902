"""Streaming detokenization never shows half a character and adds up to the whole text."""

import pytest
from transformers import AutoTokenizer

import longspec
from longspec.outputs.text import Detokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(longspec.demo_path("demo"))


@pytest.mark.parametrize("text", ["déjà vu — naïve café ☕ 🐍🐍 日本語のテキスト\n\tend",
                                  "plain ascii text with spaces   and\nnewlines"])
def test_stream_of_single_tokens_adds_up_to_the_decoded_text(tokenizer, text):
    prompt = tokenizer("print(")["input_ids"]
    ids = tokenizer(text)["input_ids"]
    detok = Detokenizer(tokenizer, prompt[-4:])
    pieces = [detok.push([t]) for t in ids] + [detok.flush()]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)

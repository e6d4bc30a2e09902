"""The ShareGPT reader: complete records up to the cut, a split by conversation."""

import json

import pytest

from longspec.models.sources import fetch_data
from longspec.zoo.sharegpt import Conversation, conversations, held_out

pytestmark = pytest.mark.unit


def record(i: int) -> dict:
    return {"id": f"c{i}_0", "conversations": [{"from": "human", "value": f"question {i}"},
                                              {"from": "gpt", "value": f"answer {i}"}]}


def test_records_are_read_up_to_the_first_incomplete_one(tmp_path):
    whole = json.dumps([record(i) for i in range(3)] + [{"id": "no turns"}], indent=2)
    cut = whole[:whole.index('"answer 2"') + 4]          # as the packaged file ends
    for text, expected in ((whole, 3), (cut, 2)):
        path = tmp_path / "sharegpt.json"
        path.write_text(text)
        got = list(conversations(path))
        assert [c.id for c in got] == [f"c{i}_0" for i in range(expected)]
        assert got[1].answers() == ["answer 1"] and got[1].turns[0] == ("human", "question 1")


def test_the_parts_of_a_conversation_fall_on_one_side_of_the_split():
    parts = [Conversation(f"abc{n}_{i}", []) for n in range(200) for i in range(3)]
    for n in range(200):
        assert len({held_out(c) for c in parts[3 * n:3 * n + 3]}) == 1
    assert 0 < sum(held_out(c) for c in parts[::3]) < 40


def test_unknown_data_sets_are_refused():
    with pytest.raises(ValueError, match="fetchable: sharegpt"):
        fetch_data("wikipedia")

"""Constrained decoding is exact under speculation: under a JSON schema, a regex and a list of
choices every method writes the tokens plain masked decoding (`ar`) writes, greedy and sampled,
alone and in a batch; the outputs match their constraint; the tokens the grammar forces are
verified as drafts; each tree node's mask is the grammar state's at the end of its path. CI runs
`auto` under a schema under every kernel profile it can emulate (.ci/run)."""

import json
import re

import pytest
import torch
from test_lossless import OPTIONS, models

import longspec
from longspec.many import run_streams
from longspec.outputs.grammar import Constraint, GrammarState, constraint_of, graft
from longspec.step.tree import DraftTree, Source, TrieBuilder

pytestmark = pytest.mark.usefixtures("costs_that_pay")

S = longspec.SamplingConfig
SAMPLINGS = {"greedy": S(temperature=0), "sampled": S(temperature=0.8, top_p=0.95)}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "count", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "count": {"type": "integer"},
                         "tags": {"type": "array", "maxItems": 3,
                                  "items": {"enum": ["red", "green", "blue"]}}}}
REGEX = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]( [a-z]{2,12}){1,4}\."
CHOICES = ["the first", "the second one", "neither of them"]
CONSTRAINTS = {"json_schema": SCHEMA, "regex": REGEX, "choice": CHOICES}
PROMPT = "The record, as asked: "
NEW_TOKENS = 64
# each method under one constraint (all three for `auto`), so the matrix stays small
METHODS = [("auto", kind) for kind in CONSTRAINTS] + [
    ("auto[fixed]", "regex"), ("auto[draft]", "json_schema"), ("suffix", "json_schema"),
    ("pld", "regex"), ("ngram", "json_schema"), ("recycling", "regex"), ("heads", "json_schema"),
    ("tokenswift", "regex"), ("draft", "json_schema"), ("selfspec", "regex"),
    ("triforce", "json_schema")]


def run(entry: str, kind: str, sampling: str, **extra):
    target, draft = models()
    method = entry.split("[")[0]
    return longspec.generate(
        target, PROMPT, max_new_tokens=NEW_TOKENS, method=method, sampling=SAMPLINGS[sampling],
        seed=5, options=OPTIONS.get(entry), **{kind: CONSTRAINTS[kind]}, **extra,
        draft_model=(draft if longspec.METHODS[method].needs_draft_model
                     or entry == "auto[draft]" else None))


def assert_follows(kind: str, text: str) -> None:
    if kind == "json_schema":
        value = json.loads(text)
        assert set(value) == {"name", "count", "tags"} and isinstance(value["count"], int)
        assert len(value["name"]) <= 24 and set(value["tags"]) <= {"red", "green", "blue"}
    elif kind == "regex":
        assert re.fullmatch(REGEX, text)
    else:
        assert text in CHOICES


@pytest.mark.parametrize("sampling", [pytest.param("greedy", marks=pytest.mark.slow),
                                      "sampled"])
@pytest.mark.parametrize("entry,kind", [  # `auto` under a schema: under every kernel profile too
    pytest.param(*m, marks=pytest.mark.profiles) if m == ("auto", "json_schema") else m
    for m in METHODS])
def test_method_matches_ar_under_a_grammar(entry, kind, sampling):
    expect = run("ar", kind, sampling)
    got = run(entry, kind, sampling)
    assert got.token_ids == expect.token_ids
    if expect.finish_reason == "eos":
        assert_follows(kind, expect.text)


def test_outputs_follow_their_constraints_to_the_end():
    for kind in CONSTRAINTS:
        res = run("auto", kind, "greedy")
        assert res.finish_reason == "eos"
        assert_follows(kind, res.text)


def test_forced_tokens_are_verified_as_drafts():
    res = run("auto", "json_schema", "greedy")
    assert res.stats["forced_tokens"] > 0
    assert 0 < res.stats["accepted_forced_tokens"] <= res.stats["forced_tokens"]
    grammar = res.stats["sources"]["grammar"]
    assert grammar["verified"] == res.stats["forced_tokens"]
    assert grammar["accepted"] == res.stats["accepted_forced_tokens"]


@pytest.mark.parametrize("together", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_constrained_generations_in_a_batch_match_each_alone(together, monkeypatch):
    """In a batch, each member judged alone and, as on CUDA, all members' rows at once
    (batching.samples_together; a shared sampling setting), free text beside them."""
    monkeypatch.setattr("longspec.engine.batching.samples_together", lambda device: together)
    target, _ = models()
    kinds = ["json_schema", "regex", "choice", None]
    requests = [dict(sampling=SAMPLINGS["sampled"], seed=5 + i, **({kind: CONSTRAINTS[kind]}
                                                                    if kind else {}))
                for i, kind in enumerate(kinds)]
    alone = [longspec.generate(target, PROMPT, max_new_tokens=NEW_TOKENS, method="ar", **r)
             for r in requests]
    streams = [longspec.api.stream_request(target, longspec.Request(
        PROMPT, max_new_tokens=NEW_TOKENS, method="auto", **r)) for r in requests]
    for _ in run_streams(target, streams, 4):
        pass
    assert [s.result.token_ids for s in streams] == [r.token_ids for r in alone]


def a_tree_after_a_partial_record():
    """The demo model, its grammar state inside a record, and a draft tree of paths the
    grammar allows and paths it does not."""
    target, _ = models()
    state = GrammarState(target, Constraint("json_schema", SCHEMA))
    tok = target.tokenizer
    state.commit(tok('{"name": "ab', add_special_tokens=False)["input_ids"])
    trie = TrieBuilder(tok("b")["input_ids"][-1], 64, 8)
    for text in ['c", "count": 1', 'cd",\n  "count"', '","tags"', 'x"}', "]]]", '"  ,']:
        trie.add_chain(tok(text, add_special_tokens=False)["input_ids"])
    return state, trie.build(torch.device("cpu"))


def test_each_nodes_mask_is_the_grammar_state_at_the_end_of_its_path():
    state, tree = a_tree_after_a_partial_record()
    before = state.mask_after([])
    masks = state.tree_masks(tree)
    assert torch.equal(state.mask_after([]), before)        # the matcher is where it was
    tokens, paths = tree.tokens.tolist(), tree.shape.host_paths.tolist()
    for node in range(tree.n):
        path = [tokens[j] for j in paths[node][1:] if j >= 0]
        alone = state.mask_after(path)
        if alone is not None:
            assert torch.equal(masks[node], alone[0])


def test_drafts_the_grammar_forbids_are_cut_before_they_are_verified():
    """allowed_nodes keeps exactly the nodes whose paths the grammar allows (the engine cuts
    the others from scored drafts: no verdict accepts them)."""
    state, tree = a_tree_after_a_partial_record()
    before = state.mask_after([])
    allowed = state.allowed_nodes(tree)
    assert torch.equal(state.mask_after([]), before)
    tokens, paths = tree.tokens.tolist(), tree.shape.host_paths.tolist()
    follows = [state.follows([tokens[j] for j in paths[node][1:] if j >= 0])
               for node in range(tree.n)]
    assert allowed == [node for node in range(tree.n) if follows[node]]
    assert 1 < len(allowed) < tree.n


def test_auto_verifies_no_draft_the_grammar_forbids(monkeypatch):
    seen = []
    verify = longspec.engine.generation.verify

    def spy(tree, target, sampler):
        tokens, paths = tree.tokens.tolist(), tree.shape.host_paths.tolist()
        seen.extend(sampler.grammar.follows([tokens[j] for j in paths[node][1:] if j >= 0])
                    for node in range(tree.n))
        return verify(tree, target, sampler)

    monkeypatch.setattr("longspec.engine.generation.verify", spy)
    res = run("auto", "json_schema", "greedy")
    assert len(seen) > res.stats["steps"] and all(seen)


def test_graft_puts_the_forced_chain_first_and_keeps_what_agrees_with_it():
    trie = TrieBuilder(7, 16, 8)
    trie.add_chain([1, 2, 3, 4], probs=[0.5, 0.5, 0.5, 0.5], source=2)   # agrees, then goes on
    trie.add_chain([1, 9], probs=[0.5, 0.5], source=3)                  # disagrees at depth 2
    tree = graft(trie.build(torch.device("cpu")), [1, 2], max_nodes=16)
    assert tree.tokens.tolist() == [7, 1, 2, 3, 4]
    assert tree.shape.parents == [-1, 0, 1, 2, 3]
    assert tree.sources[1:3] == [Source.GRAMMAR] * 2 and tree.sources[3:] == [Source.PREDICTION] * 2
    assert tree.scores == pytest.approx([1, 1, 1, 0.5, 0.25])
    short = graft(DraftTree.chain([7], torch.device("cpu")), [1, 2, 3], max_nodes=3)
    assert short.tokens.tolist() == [7, 1, 2] and short.scores is None


@pytest.mark.parametrize("settings,message", [
    ({"json_schema": {"type": "objectx"}}, "cannot be compiled"),
    ({"regex": "a(b"}, "cannot be compiled"),
    ({"json_schema": SCHEMA, "regex": "a"}, "one constraint"),
    ({"choice": []}, "non-empty strings"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"regex": "a", "ignore_eos": True}, "ignore_eos"),
    ({"regex": "a", "verify": "rejection", "method": "draft"}, "verify='match'"),
])
def test_bad_constraints_are_refused_before_any_work(settings, message):
    target, draft = models()
    extra = {"draft_model": draft} if settings.get("method") == "draft" else {}
    with pytest.raises(ValueError, match=re.escape(message)):
        longspec.generate(target, PROMPT, max_new_tokens=8, **settings, **extra)


def test_response_format_takes_openais_forms_and_pydantic_models():
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        name: str
        count: int

    assert constraint_of(response_format={"type": "text"}) is None
    assert constraint_of(response_format={"type": "json_object"}).kind == "json_object"
    assert constraint_of(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": SCHEMA, "strict": True}}) == Constraint("json_schema", SCHEMA)
    assert constraint_of(response_format=Item).value == Item.model_json_schema()


def test_the_cli_holds_the_output_to_a_schema_or_a_choice(tmp_path, capsys):
    from longspec.cli import main

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    base = ["generate", "demo", "--prompt", PROMPT, "--temperature", "0", "--no-progress",
            "--max-new-tokens", str(NEW_TOKENS), "--dtype", "float32"]
    assert main([*base, "--json-schema", str(schema), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["finish_reason"] == "eos"
    assert_follows("json_schema", out["text"])
    assert main([*base, "--choice", CHOICES[0], "--choice", CHOICES[1]]) == 0
    assert capsys.readouterr().out.strip() in CHOICES[:2]
    assert main([*base, "--regex", "a(b"]) == 2
    assert "the regex cannot be compiled" in capsys.readouterr().err

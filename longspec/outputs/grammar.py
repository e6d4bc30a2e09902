"""Constrained decoding: an output held to a JSON schema, a regex, a Lark grammar or a list of
choices, on llguidance (its matcher computes a token mask on the CPU in tens of microseconds,
rolls back tokens, and names the tokens the grammar forces).

The grammar's mask is the first step of the fixed logits order (sampling/logits.py): a token the
grammar does not allow gets -inf before the penalty, the temperature and the filters. Under
speculation every node of a draft tree is judged under the mask of the grammar state at the end
of its own path (the matcher walks the tree depth first, consuming a node's token and rolling
it back), so the tokens committed are those plain masked decoding writes, for every method.

Glossary:
- forced tokens: what the grammar allows next with certainty from the committed text (a
  key, a brace, the rest of an enum value: llguidance's fast-forward tokens). They are a draft
  source (`graft`): verified like any draft, never appended as text and re-tokenized.
- mask: bool [vocab], the tokens the grammar allows after a given text; a bitmask of int32
  words on llguidance's side.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch

from ..device.memory import upload
from ..step.tree import DraftTree, Source, TreeShape

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")
# Whitespace a JSON output may put between its tokens: none, a space, or a new line and its
# indentation (llama.cpp's JSON grammars allow the same). Unbounded whitespace lets a sampled
# output spend its tokens on blanks; none at all (compact JSON) turned Qwen2.5-Coder-1.5B's
# extraction of 22 records into an empty list, where it writes them all when it may indent.
JSON_OPTIONS = {"whitespace_pattern": r"( |\n[ \t]{0,20})?"}


@dataclass(frozen=True)
class Constraint:
    """What an output must match: `kind` one of KINDS; `value` the JSON schema (a mapping or
    its JSON text), the regex, the Lark grammar's text, or the choices (strings); None for
    json_object (any JSON object)."""

    kind: str
    value: Any = None

    def grammar(self) -> str:
        """llguidance's grammar for the constraint (ValueError for a malformed one)."""
        compile_ = llguidance.LLMatcher
        if self.kind == "json_schema":
            schema = self.value
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as e:
                    raise ValueError(f"the JSON schema is not JSON: {e}") from None
            if not isinstance(schema, Mapping):
                raise ValueError(f"a JSON schema must be a JSON object, got {schema!r:.60}")
            return compile_.grammar_from_json_schema(dict(schema), defaults=JSON_OPTIONS)
        if self.kind == "json_object":
            return compile_.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if self.kind == "regex":
            if not isinstance(self.value, str) or not self.value:
                raise ValueError(f"regex must be a non-empty string, got {self.value!r}")
            return compile_.grammar_from_regex(self.value)
        if self.kind == "grammar":
            if not isinstance(self.value, str) or not self.value.strip():
                raise ValueError(f"grammar must be a Lark grammar's text, got {self.value!r:.60}")
            return compile_.grammar_from_lark(self.value)
        if self.kind == "choice":
            choices = self.value
            if (isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence)
                    or not choices or not all(isinstance(c, str) and c for c in choices)):
                raise ValueError(f"choice must be a list of non-empty strings, got {choices!r}")
            return compile_.grammar_from_regex("|".join(f"({re.escape(c)})" for c in choices))
        raise ValueError(f"unknown constraint {self.kind!r}; constraints are: {', '.join(KINDS)}")


def constraint_of(*, json_schema=None, regex=None, grammar=None, choice=None,
                  response_format=None) -> Constraint | None:
    """The one constraint among a request's settings (None without one). `response_format`
    takes OpenAI's forms ({"type": "text" | "json_object" | "json_schema", "json_schema":
    {"name", "schema", "strict"}}) or a pydantic model class (its JSON schema)."""
    given = {"json_schema": json_schema, "regex": regex, "grammar": grammar, "choice": choice,
             "response_format": response_format}
    named = [name for name, value in given.items() if value is not None]
    if len(named) > 1:
        raise ValueError(f"an output takes one constraint, got {' and '.join(named)}")
    if not named:
        return None
    name = named[0]
    if name != "response_format":
        return Constraint(name, given[name])
    return _from_response_format(response_format)


def _from_response_format(fmt) -> Constraint | None:
    schema_of = getattr(fmt, "model_json_schema", None)
    if callable(schema_of):                      # a pydantic model class
        return Constraint("json_schema", schema_of())
    if not isinstance(fmt, Mapping) or fmt.get("type") not in ("text", "json_object",
                                                                "json_schema"):
        raise ValueError('response_format must be {"type": "text"}, {"type": "json_object"} or '
                         '{"type": "json_schema", "json_schema": {"name": ..., "schema": ...}}, '
                         f"got {fmt!r:.80}")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return Constraint("json_object")
    spec = fmt.get("json_schema")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
        raise ValueError('response_format of type "json_schema" needs "json_schema": '
                         '{"name": ..., "schema": {...}}')
    return Constraint("json_schema", spec.get("schema", {}))


def grammar_tokenizer(model):
    """llguidance's tokenizer for the model (made once, ~1 s for a large vocabulary, and kept
    in the model's shared state): its vocabulary padded to the model's rows, its end of
    sequence the model's."""
    state = model.state
    if state.grammar_tokenizer is None:
        tok = model.tokenizer
        if tok is None or not hasattr(tok, "backend_tokenizer"):
            raise ValueError(f"{model.name} has no fast tokenizer to hold its output to a grammar")
        eos = sorted(model.eos_token_ids)
        state.grammar_tokenizer = llguidance.hf.from_tokenizer(
            tok, n_vocab=model.config.vocab_size, eos_token=eos or None)
    return state.grammar_tokenizer


class GrammarState:
    """One generation's place in its grammar: a matcher that has consumed the new tokens
    committed so far (the prompt is not the grammar's)."""

    def __init__(self, model, constraint: Constraint):
        """A ValueError naming the constraint where llguidance cannot compile it."""
        grammar = constraint.grammar()
        self.matcher = llguidance.LLMatcher(grammar_tokenizer(model), grammar, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"the {constraint.kind.replace('_', ' ')} cannot be compiled: "
                             f"{self.matcher.get_error()}")
        self.vocab = model.config.vocab_size
        self.words = (self.vocab + 31) // 32
        self.device = model.device

    def follows(self, tokens: list[int]) -> bool:
        """Whether the grammar allows `tokens` from here (nothing consumed)."""
        return self.matcher.validate_tokens(tokens) == len(tokens)

    def commit(self, tokens: list[int]) -> None:
        for token in tokens:
            if self.matcher.is_stopped():      # only the end of sequence follows: a stop rule
                return
            if not self.matcher.consume_token(token):
                raise RuntimeError("a committed token left the grammar: "
                                   f"{self.matcher.get_error()}")

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (llguidance's fast-forward tokens)."""
        if self.matcher.is_stopped():
            return []
        return self.matcher.compute_ff_tokens()

    def _advance(self, tokens: Sequence[int]) -> int:
        """Consume the tokens while the grammar allows them; how many it consumed. (A matcher
        that consumes a token it does not allow is broken for good, and one that has stopped
        takes the end of sequence without counting it as a token to roll back.)"""
        m = self.matcher
        for i, token in enumerate(tokens):
            if m.is_stopped() or m.validate_tokens([token]) != 1:
                return i
            m.consume_token(token)
        return len(tokens)

    def _fill(self, words: np.ndarray) -> None:
        self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)

    def _allowed(self, words: np.ndarray) -> torch.Tensor:
        """Bool [n, vocab] from bitmask words [n, words]; a row that allows nothing (past the
        grammar's end: never committed) allows everything, so that no row is all -inf."""
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :self.vocab]
        allowed = torch.from_numpy(bits.astype(bool))
        allowed[~allowed.any(dim=1)] = True
        return allowed.to(self.device)

    def _walk(self, tree: DraftTree, root_valid: bool, allows, visit) -> None:
        """Depth first over the nodes past the root, the matcher holding each node's path
        (past what it held at the root) while `visit(node, True)` runs; a node whose parent's
        path the grammar allows and `allows(node, token)` does not, and every node below it,
        get `visit(node, False)`. The matcher ends where it began."""
        m = self.matcher
        parents, depths = tree.shape.parents, tree.shape.depths
        tokens = tree.tokens.tolist()
        children: list[list[int]] = [[] for _ in range(tree.n)]
        for node in range(1, tree.n):
            children[parents[node]].append(node)
        stack = [(child, root_valid) for child in reversed(children[0])]
        depth = 0                                  # path tokens the matcher holds
        while stack:
            node, parent_valid = stack.pop()
            target = depths[node] - 1              # the parent's depth: rewind to it
            if depth > target:
                m.rollback(depth - target)
                depth = target
            token = tokens[node]
            ok = (parent_valid and not m.is_stopped() and allows(node, token)
                  and m.consume_token(token))
            depth += bool(ok)
            visit(node, bool(ok))
            stack.extend((child, bool(ok)) for child in reversed(children[node]))
        m.rollback(depth)

    def allowed_nodes(self, tree: DraftTree) -> list[int]:
        """The nodes of `tree` (rooted at the last committed token) whose paths the grammar
        allows, the root first, in order: the others can never be accepted."""
        allowed = [True] + [False] * (tree.n - 1)

        def visit(node: int, ok: bool) -> None:
            allowed[node] = ok

        self._walk(tree, True, lambda node, token: self.matcher.validate_tokens([token]) == 1,
                   visit)
        return [node for node in range(tree.n) if allowed[node]]

    def tree_masks(self, tree: DraftTree, ahead: Sequence[int] = ()) -> torch.Tensor:
        """Allowed tokens [n, vocab] after each node of `tree`, whose root is the last of the
        committed tokens and `ahead` (tokens past them, not committed). A node whose path the
        grammar does not allow takes its parent's mask: its parent's choice (masked) cannot be
        its token, so it is never accepted."""
        words = np.empty((tree.n, self.words), dtype=np.int32)
        consumed = self._advance(ahead)
        valid = consumed == len(ahead)
        if valid:
            self._fill(words[0])
        else:
            words[0] = -1                           # never committed: anything goes
        parents = tree.shape.parents

        def allows(node: int, token: int) -> bool:
            word, bit = divmod(token, 32)
            return bool((words[parents[node], word] >> bit) & 1)

        def visit(node: int, ok: bool) -> None:
            if ok:
                self._fill(words[node])
            else:
                words[node] = words[parents[node]]

        self._walk(tree, valid, allows, visit)
        self.matcher.rollback(consumed)
        return self._allowed(words)

    def mask_after(self, path: Sequence[int]) -> torch.Tensor | None:
        """Allowed tokens [1, vocab] after the committed tokens and `path`, or None where the
        grammar does not allow the path (a draft's guess: anything goes)."""
        m = self.matcher
        consumed = self._advance(path)
        if consumed < len(path):
            m.rollback(consumed)
            return None
        words = np.empty((1, self.words), dtype=np.int32)
        self._fill(words[0])
        m.rollback(consumed)
        return self._allowed(words)


def graft(tree: DraftTree, forced: list[int], max_nodes: int) -> DraftTree:
    """The tree with the forced tokens as a chain below its root (up to `max_nodes` nodes in
    all): the tree's nodes that agree with the chain merge into it, those past its end hang
    below it (their scores relative to where they hang), and those that disagree with it are
    dropped, since the masked choice at their parent cannot be their token."""
    k = min(len(forced), max_nodes - 1)
    if k <= 0:
        return tree
    parents, depths, tokens = tree.shape.parents, tree.shape.depths, tree.tokens.tolist()
    new_parents, new_tokens = [-1, *range(k)], [tokens[0], *forced[:k]]
    scored = tree.scores is not None
    scores, sources = [1.0] * (k + 1), [0] + [Source.GRAMMAR] * k
    placed = {0: 0}          # old node -> new node
    anchor = {0: 1.0}        # old node -> the old score of its ancestor where it hangs
    for node in range(1, tree.n):
        p = parents[node]
        if p not in placed:
            continue
        d = depths[node]
        if d <= k:
            if tokens[node] == forced[d - 1]:
                placed[node] = d
                anchor[node] = tree.scores[node] if scored else 1.0
            continue
        if len(new_tokens) >= max_nodes:
            continue
        placed[node] = len(new_tokens)
        anchor[node] = anchor[p]
        new_parents.append(placed[p])
        new_tokens.append(tokens[node])
        if scored:
            scores.append(tree.scores[node] / anchor[node] if anchor[node] > 0 else 0.0)
            sources.append(tree.sources[node])
    device = tree.tokens.device
    return DraftTree(TreeShape.of(tuple(new_parents), device), upload(new_tokens, device),
                     scores=scores if scored else None, sources=sources if scored else None)

"""How a model writes tool calls: a registry of formats, each with the grammar its calls are
written under, the parser that reads them back into OpenAI's form, and how much of a streamed
text may go out before a call may begin. A format is named (`tool_format=`, the server's
`--tool-call-format`) or recognised from the chat template (`recognised`).

| name | models | a call as the model writes it |
|---|---|---|
| `hermes` | Qwen2.5, Qwen3, Hermes | `<tool_call>{"name": "f", "arguments": {...}}</tool_call>` |
| `mistral` | Mistral (v3 tokenizers) | `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` |
| `llama3_json` | Llama 3.1 - 3.3 | `{"name": "f", "parameters": {...}}`, calls joined by `; ` |
| `pythonic` | Llama 3.2 (pythonic template), Llama 4 | `[f(a=1, b="x"), g()]` |

Under a grammar (tool_choice required or named; auto where a function is `strict`) a call's
syntax is forced and its JSON arguments follow the function's schema (pythonic: its argument
names are the function's parameters, their values Python literals).
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from .grammar import Constraint

# a call's JSON as the templates write it ({"name": "f", "arguments": {"a": 1}}): no other
# whitespace, so that its keys and punctuation are forced tokens
CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_TEXT = "/(.|\\n)*/"


def call_schema(function: dict, key: str, held: bool) -> dict:
    """The JSON schema of one call of `function`: its name, and its arguments under `key`, held
    to its parameters' schema (`held`) or to any JSON object."""
    arguments = (function.get("parameters") or {"type": "object"}) if held else {"type": "object"}
    return {"type": "object", "additionalProperties": False, "required": ["name", key],
            "properties": {"name": {"const": function["name"]}, key: arguments}}


def one_of(schemas: list[dict]) -> dict:
    return {**(schemas[0] if len(schemas) == 1 else {"anyOf": schemas}), "x-guidance": CALL_JSON}


def openai_call(name: str, arguments, call_id: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def marker(tokenizer, text: str) -> str:
    """A marker in the grammar: its token, named by id, where the vocabulary holds it as one
    (Qwen2.5's <tool_call> is a special token, which a quoted text would not match), else its
    text."""
    token = tokenizer.convert_tokens_to_ids(text)
    if isinstance(token, int) and token != tokenizer.unk_token_id and \
            tokenizer.decode([token]) == text:
        return f"<[{token}]>"
    return json.dumps(text)


def lark(start: str, rules: str) -> Constraint:
    return Constraint("grammar", f"start: {start}\n{rules}")


@dataclass(frozen=True)
class ToolFormat(ABC):
    """One way of writing tool calls (see the module's table)."""

    name: str

    @abstractmethod
    def recognises(self, template: str) -> bool:
        """Whether a chat template's model writes its calls this way."""

    @abstractmethod
    def constraint(self, tokenizer, functions: list[dict], many: bool, text: bool,
                   ) -> Constraint:
        """Calls of these functions: one (`many` False) or one or more; with `text` (tool_choice
        auto) any text instead, or before them where the format allows, and only `strict`
        functions' arguments held to their schemas."""

    @abstractmethod
    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """The output's text without its calls (None when empty) and the calls, in OpenAI's
        form; a call that does not parse stays in the text."""

    @abstractmethod
    def held_back(self, text: str) -> int:
        """How much of a streamed text can go out now: all of it but what may be, or is, a
        call."""

    def call_id(self) -> str:
        return "call_" + uuid.uuid4().hex[:24]

    def kept(self, tokenizer) -> frozenset[int]:
        """The special tokens a text keeps for these calls to be read back from it."""
        return frozenset()


@dataclass(frozen=True)
class Marked(ToolFormat):
    """Calls that follow a marker token, after any text: Hermes blocks (one a call, closed by
    `close`) or Mistral's one list of calls."""

    open: str
    close: str | None        # None: one JSON list of every call follows the marker
    json_key: str = "arguments"

    def recognises(self, template: str) -> bool:
        return self.open in template

    def constraint(self, tokenizer, functions, many, text):
        schema = one_of([call_schema(f, self.json_key, f.get("strict") or not text)
                         for f in functions])
        opening = marker(tokenizer, self.open)
        if self.close is None:
            schema = {"type": "array", "items": schema, "minItems": 1,
                      **({} if many else {"maxItems": 1}), "x-guidance": CALL_JSON}
            rest, repeat = "body", ""
        else:
            rest = f'"\\n" body "\\n" {marker(tokenizer, self.close)} "\\n"?'
            repeat = "*" if many else ""
        rules = f"call: {opening} {rest}\nbody: %json {json.dumps(schema)}\n"
        if not text:
            return lark(f"call{'+' if repeat else ''}", rules)
        if opening.startswith("<["):     # a special token, never part of a text
            return lark(f"TEXT call{repeat or '?'}", rules + f"TEXT: {ANY_TEXT}\n")
        # a text marker: the text before a first call ends lazily at its marker; a text
        # without one never holds it
        return lark(f"TEXT | prefix rest{' call*' if repeat else ''}",
                    rules + f"rest: {rest}\nprefix[lazy]: /(.|\\n)*{re.escape(self.open)}/\n"
                    f"TEXT: {ANY_TEXT} & ~/(.|\\n)*{re.escape(self.open)}(.|\\n)*/\n")

    def parse(self, text):
        if self.close is None:
            return self._parse_list(text)
        pattern = re.compile(re.escape(self.open) + r"\s*(.*?)\s*" + re.escape(self.close),
                             re.DOTALL)
        calls, kept, at = [], [], 0
        for match in pattern.finditer(text):
            call = self._call(match.group(1))
            if call is None:
                continue
            kept.append(text[at:match.start()])
            at = match.end()
            calls.append(call)
        kept.append(text[at:])
        return ("".join(kept).strip() or None), calls

    def _parse_list(self, text):
        start = text.find(self.open)
        if start < 0:
            return text.strip() or None, []
        try:
            items = json.loads(text[start + len(self.open):])
            calls = [self._call(json.dumps(item)) for item in items]
        except (json.JSONDecodeError, TypeError):
            return text.strip() or None, []
        if not calls or None in calls:
            return text.strip() or None, []
        return text[:start].strip() or None, calls

    def _call(self, source: str) -> dict | None:
        try:
            call = json.loads(source)
            return openai_call(call["name"], call.get(self.json_key, {}), self.call_id())
        except (json.JSONDecodeError, KeyError, TypeError):
            return None

    def kept(self, tokenizer):
        found = [marker(tokenizer, text) for text in (self.open, self.close) if text]
        return frozenset(int(m[2:-2]) for m in found if m.startswith("<["))

    def held_back(self, text):
        start = text.find(self.open)
        if start >= 0:
            return start
        for k in range(min(len(self.open) - 1, len(text)), 0, -1):
            if self.open.startswith(text[-k:]):
                return len(text) - k
        return len(text)


@dataclass(frozen=True)
class Mistral(Marked):
    def call_id(self) -> str:
        return uuid.uuid4().hex[:9]      # Mistral's templates take ids of 9 letters and digits


@dataclass(frozen=True)
class Whole(ToolFormat):
    """Calls that are the whole output (Llama's JSON, or a Python list of calls): an output
    that starts as one is a call, or calls, and is held back while streamed."""

    starts: str               # the character a call starts with

    def held_back(self, text):
        stripped = text.lstrip().removeprefix(PYTHON_TAG)
        return 0 if not stripped or PYTHON_TAG.startswith(stripped) or \
            stripped.startswith(self.starts) else len(text)

    def _free_or(self, calls: str, rules: str, text: bool) -> Constraint:
        if not text:
            return lark(calls, rules)
        return lark(f"{calls} | TEXT?", rules + f"TEXT: /[^{re.escape(self.starts)}](.|\\n)*/\n")


PYTHON_TAG = "<|python_tag|>"      # Llama's marker of a call in its templates' code-tool turn


@dataclass(frozen=True)
class Llama3Json(Whole):
    def recognises(self, template):
        return "Given the following functions" in template or PYTHON_TAG in template

    def constraint(self, tokenizer, functions, many, text):
        schema = one_of([call_schema(f, "parameters", f.get("strict") or not text)
                         for f in functions])
        calls = 'call ("; " call)*' if many else "call"
        return self._free_or(calls, f"call: %json {json.dumps(schema)}\n", text)

    def parse(self, text):
        source = text.strip().removeprefix(PYTHON_TAG).lstrip()
        calls, at, decoder = [], 0, json.JSONDecoder()
        while source.startswith("{", at):
            try:
                call, at = decoder.raw_decode(source, at)
                calls.append(openai_call(call["name"], call.get("parameters",
                                                                call.get("arguments", {})),
                                         self.call_id()))
            except (json.JSONDecodeError, KeyError, TypeError):
                return text.strip() or None, []
            at = len(source) - len(source[at:].lstrip().removeprefix(";").lstrip())
        if not calls or at < len(source):
            return text.strip() or None, []
        return None, calls


@dataclass(frozen=True)
class Pythonic(Whole):
    def recognises(self, template):
        return "func_name1(" in template

    def constraint(self, tokenizer, functions, many, text):
        # each function's call: its name, then its parameters by name, each a Python literal
        rules = []
        for i, f in enumerate(functions):
            names = list((f.get("parameters") or {}).get("properties") or {})
            argument = " | ".join(json.dumps(f"{n}=") for n in names) or '""'
            rules.append(f"call{i}: {json.dumps(f['name'] + '(')} (arg{i} (\", \" arg{i})*)? "
                         f'")"\narg{i}: ({argument}) value\n')
        alternatives = " | ".join(f"call{i}" for i in range(len(functions)))
        literal = ('value: STRING | NUMBER | "True" | "False" | "None" '
                   '| "[" (value (", " value)*)? "]" | "{" (STRING ": " value '
                   '(", " STRING ": " value)*)? "}"\n'
                   'STRING: /"([^"\\\\\\n]|\\\\.)*"/ | /\'([^\'\\\\\\n]|\\\\.)*\'/\n'
                   "NUMBER: /-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?/\n")
        calls = '"[" call (", " call)* "]"' if many else '"[" call "]"'
        return self._free_or(calls, f"call: {alternatives}\n" + "".join(rules) + literal, text)

    def parse(self, text):
        source = text.strip().removeprefix(PYTHON_TAG).strip()
        try:
            tree = ast.parse(source, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                raise ValueError
            calls = []
            for node in tree.elts:
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and not node.args):
                    raise ValueError
                arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                calls.append(openai_call(node.func.id, arguments, self.call_id()))
        except (SyntaxError, ValueError, TypeError):
            return text.strip() or None, []
        return None, calls


# recognised in this order: the first whose mark the template holds
FORMATS = {f.name: f for f in (
    Mistral("mistral", open="[TOOL_CALLS]", close=None),
    Marked("hermes", open="<tool_call>", close="</tool_call>"),
    Pythonic("pythonic", starts="["),
    Llama3Json("llama3_json", starts="{"),
)}


def named_format(name: str) -> ToolFormat:
    if name not in FORMATS:
        raise ValueError(f"tool_format must be one of {', '.join(FORMATS)}, got {name!r}")
    return FORMATS[name]


def recognised(template: str) -> ToolFormat | None:
    """The format a chat template's model writes its calls in (None: none recognised)."""
    return next((f for f in FORMATS.values() if f.recognises(template)), None)

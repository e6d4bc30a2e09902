"""No function of the library takes more than MAX_POSITIONAL positional parameters (self and cls
not counted): past that, a call site's arguments are named. Triton kernels are exempt: their
parameters are the launch's arguments, pointers and strides, which Triton takes positionally."""

import ast
from pathlib import Path

import pytest

import longspec

pytestmark = pytest.mark.unit

MAX_POSITIONAL = 8


def test_no_function_takes_more_than_eight_positional_parameters():
    too_many = []
    for path in Path(longspec.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not any(
                    ast.unparse(d) == "triton.jit" for d in node.decorator_list):
                names = [a.arg for a in node.args.posonlyargs + node.args.args]
                count = len([n for n in names if n not in ("self", "cls")])
                if count > MAX_POSITIONAL:
                    too_many.append(f"{path.name}:{node.lineno} {node.name} ({count})")
    assert not too_many, too_many

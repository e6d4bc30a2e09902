"""The package's layers: every module belongs to a package of LAYERS, a package imports only
itself and the packages below it, and docs/development.md's layout table names them all in this
order. An annotation may name a type from above (an import under `if TYPE_CHECKING:`, which
never runs); no code imports upward."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "longspec"
# bottom to top; "longspec" is the top-level package's own modules (the Python API)
LAYERS = ["zoo", "device", "cache", "state", "step", "models", "heads", "outputs", "sampling",
          "drafters", "engine", "longspec", "openai_api", "anthropic_api", "serve", "jobs",
          "training", "bench", "cli"]


def package_of(module: str) -> str:
    """The layer package of a dotted module name under longspec."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "longspec"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING",
                                                                    "typing.TYPE_CHECKING"):
            for inner in node.body:
                lines.update(range(inner.lineno, inner.end_lineno + 1))
    return lines


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every longspec import in `path` that runs."""
    tree = ast.parse(path.read_text())
    skipped = type_checking_lines(tree)
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("longspec.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("longspec"):
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return found


def test_every_import_runs_down_the_layers():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = package_of(module_name(path))
        assert mine in LAYERS, f"{path.relative_to(ROOT)}: package {mine} is not in LAYERS"
        for line, target in imports(path):
            theirs = package_of(target)
            if LAYERS.index(theirs) > LAYERS.index(mine):
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({mine}) imports {target} "
                             f"({theirs})")
    assert not wrong, "imports up the layers:\n" + "\n".join(wrong)


def test_the_layout_table_names_every_layer_in_order():
    page = (ROOT / "docs" / "development.md").read_text()
    table = page.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\| `longspec(?:/(\w+))?/` \|", table, re.MULTILINE)
    assert [n or "longspec" for n in named] == LAYERS[::-1]

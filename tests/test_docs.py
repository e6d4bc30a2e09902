"""The README is a map: at most 220 lines, linking every page of docs/; every relative link in it
and in docs/*.md leads to a file that exists, and an #anchor to a heading of that file (the
results page's checker); and the commands of its "Set up" section run as written."""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_benchmarks_page import broken, links

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 220


@pytest.mark.unit
def test_readme_is_a_map_of_at_most_220_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move detail to docs/"


@pytest.mark.unit
@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_the_readme_and_docs_resolves(page):
    assert not broken(page), f"{page.relative_to(ROOT)}: {broken(page)}"


@pytest.mark.unit
def test_the_readme_links_every_page_of_docs():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(README)}
    missing = [page.name for page in DOCS if page.resolve() not in linked]
    assert not missing, f"README.md links no docs/{', docs/'.join(missing)}"


def setup_commands() -> list[list[str]]:
    """The `longspec` commands of the README's "Set up" section, as written: each bash block's
    lines (continuations joined), split at `&&`, the parts that run `longspec`."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words and words[0] == "longspec":
                    commands.append(words)
    return commands


@pytest.mark.slow
def test_the_readmes_setup_commands_run_as_written():
    """`longspec demo` as the README runs it (SmolLM2, fetched on first use; the bundled demo
    model without network)."""
    commands = setup_commands()
    assert ["longspec", "demo"] in commands, commands
    exe = shutil.which("longspec")
    for words in commands:
        argv = [exe, *words[1:]] if exe else [sys.executable, "-m", "longspec.cli", *words[1:]]
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600,
                              cwd=ROOT)
        assert done.returncode == 0, (f"{shlex.join(words)} exited {done.returncode}:\n"
                                      f"{done.stderr[-3000:]}")

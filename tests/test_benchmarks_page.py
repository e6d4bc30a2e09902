"""The results page stays a page: BENCHMARKS.md at most 220 lines, and every relative link in it
and in docs/benchmarks/ leads to a file that exists, and an #anchor to a heading of that file."""

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).parent.parent
PAGE = ROOT / "BENCHMARKS.md"
PAGES = [PAGE, *sorted((ROOT / "docs" / "benchmarks").rglob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")


def prose_lines(text: str):
    """The lines outside fenced code blocks (a '#' in a shell block is not a heading)."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text lowercased, spaces to '-', every character that
    is not a letter, a digit, '-' or '_' dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # a link's text, not its target
    text = text.lower().replace(" ", "-")
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    """The relative targets of the markdown links outside code."""
    out = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):      # http:, https:, mailto:
                out.append(target)
    return out


def broken(path: Path) -> list[str]:
    bad = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {dest.name}")
    return bad


def test_slugs_follow_githubs_rules():
    assert slug("On a GPU: NVIDIA H200 (2026-11-28)") == "on-a-gpu-nvidia-h200-2026-11-28"
    assert slug("`auto` where no draft pays") == "auto-where-no-draft-pays"
    assert slug("AVX512_BF16 (this CPU as it is)") == "avx512_bf16-this-cpu-as-it-is"
    assert (slug("Qwen2.5-Coder-1.5B in TokenSwift's setting")
            == "qwen25-coder-15b-in-tokenswifts-setting")


def test_the_results_page_is_at_most_220_lines():
    lines = PAGE.read_text(encoding="utf-8").count("\n")
    assert lines <= 220, f"BENCHMARKS.md has {lines} lines: move a section to docs/benchmarks/"


def test_every_link_of_the_benchmark_pages_resolves():
    bad = {str(p.relative_to(ROOT)): broken(p) for p in PAGES}
    assert not {p: b for p, b in bad.items() if b}

"""Training text for the bundled demo models: the Python standard library's own source.

The demo models never see the standard library's test suites nor any installed third-party
package, so the sources of a third-party package make held-out prompts for benchmarks.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

# Folders of the standard library that are test suites or hold third-party code.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages",
                           "__pycache__"})


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources(root: Path | None = None) -> list[Path]:
    """Every `.py` file of the standard library outside test folders, in a stable order."""
    root = root or stdlib_dir()
    files = [
        p for p in root.rglob("*.py")
        if not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])
    ]
    if not files:
        raise ValueError(f"no Python sources found under {root}")
    return sorted(files)


def read_texts(files: list[Path]) -> list[str]:
    """File contents, skipping unreadable or empty files."""
    texts = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            texts.append(text)
    return texts

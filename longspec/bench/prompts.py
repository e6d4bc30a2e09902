"""Benchmark prompts from text the demo models never saw.

The demo models trained on the Python standard library; transformers, a dependency of
longspec, is installed wherever longspec is, and its sources are a long, held-out Python text.
"""

from __future__ import annotations

from pathlib import Path

from ..outputs.text import read_text_file

DEFAULT_SOURCES = ("generation/utils.py", "modeling_utils.py", "trainer.py")


def default_prompt_text() -> str:
    import transformers

    root = Path(transformers.__file__).resolve().parent
    parts = [(root / name).read_text(encoding="utf-8") for name in DEFAULT_SOURCES
             if (root / name).is_file()]
    if not parts:
        raise ValueError("transformers' sources are missing; pass --prompt-file")
    return "\n\n".join(parts)


def prompt_ids(model, prompt_len: int, prompt_file: str | None = None) -> list[int]:
    """The first `prompt_len` tokens of the prompt text (the default text or `prompt_file`)."""
    if model.tokenizer is None:
        raise ValueError(f"{model.path} has no tokenizer; benchmarks need one to encode prompts")
    if prompt_file is not None:
        text = read_text_file(prompt_file, "prompt file")
    else:
        text = default_prompt_text()
    ids = model.tokenizer(text)["input_ids"]
    if len(ids) < prompt_len:
        raise ValueError(f"the prompt text has {len(ids)} tokens, "
                         f"fewer than --prompt-len {prompt_len}")
    return ids[:prompt_len]

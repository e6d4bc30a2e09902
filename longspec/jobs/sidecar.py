"""The sidecar of a run written to a file: `FILE.longspec.json`, what `--resume` continues from.

The source of truth is the token ids in the sidecar, not the text file: a run can be killed
(SIGKILL included) between any two writes, and the text of a token prefix is not always a prefix
of the final text (a UTF-8 character split across tokens, a stop string cut off at the end). So
the text file is a view: appended to as tokens are committed, and rewritten from the sidecar's
token ids whenever they and the text could disagree (on resume, and at the end).

The sidecar is one JSON object, replaced atomically (a temporary file, fsync, os.replace), so a
reader sees the previous version or the next one, never a torn one:

    format          "longspec-run/1"
    settings        everything that determines the tokens (compared on resume, see below)
    info            what is recorded but not compared (the model's path, the device)
    prompt_ids      the prompt's token ids
    token_ids       the new tokens committed so far
    prefix_bytes    the size of FILE before the run: the run's text follows these bytes
    finished        true once the run ended by itself (eos, stop, length)
    finish_reason   eos, stop or length once finished, else null
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..models.loader import Model
from ..outputs.tools import checked_tools
from ..request import Request
from ..sampling.logits import SamplingConfig

FORMAT = "longspec-run/1"
SUFFIX = ".longspec.json"
# files whose bytes are hashed in a model's fingerprint; larger ones count by name and size
SMALL_FILE_BYTES = 32 << 20
MODEL_FILES = {".json", ".safetensors", ".gguf", ".model", ".txt", ".jinja", ".bin"}


def sidecar_path(output: str | Path) -> Path:
    return Path(str(output) + SUFFIX)


def fingerprint(path: Path) -> str:
    """A cheap identity of a checkpoint: the bytes of its small files (config, tokenizer) and the
    names and sizes of its large ones (weights), hashed. Moving the directory keeps it."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir() if p.is_file() and p.suffix in MODEL_FILES)
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        if size <= SMALL_FILE_BYTES:
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _stop_list(stop) -> list:
    if stop is None:
        return []
    return [stop] if isinstance(stop, (str, int)) else list(stop)


def run_settings(model: Model, request: Request) -> dict:
    """The settings that determine a run's tokens, as JSON values: a resumed run must have the
    same ones to continue the same generation."""
    r = request
    sampling = r.sampling if r.sampling is not None else SamplingConfig()
    draft = r.draft_model
    # the grammar the output is held to, a tool_choice's compiled too: a change to how tools
    # compile changes the run
    constraint = r.constraint() or checked_tools(model, r.tools, r.tool_choice,
                                                 r.parallel_tool_calls, r.tool_format)[1]
    return {
        "model": fingerprint(model.path),
        "dtype": str(model.dtype).removeprefix("torch."),
        "weights": model.weight_format,
        "method": r.method,
        "verify": r.verify,
        "options": dict(r.options or {}),
        "sampling": asdict(sampling),
        "seed": r.seed,
        "stop": _stop_list(r.stop),
        "grammar": None if constraint is None else constraint.grammar(),
        "tools": r.tools,
        "tool_choice": r.tool_choice,
        "parallel_tool_calls": r.parallel_tool_calls,
        "tool_format": r.tool_format,
        "min_new_tokens": r.min_new_tokens,
        "logit_bias": None if r.logit_bias is None else {str(k): v
                                                          for k, v in r.logit_bias.items()},
        "ignore_eos": r.ignore_eos,
        "max_new_tokens": r.max_new_tokens,
        "keep_special": r.keep_special,
        "include_stop": r.include_stop,
        "draft_model": None if draft is None else fingerprint(draft.path),
        "heads": None if r.heads is None else str(r.heads),
        "kernel_profile": _compared_profile(model),
    }


def _compared_profile(model: Model) -> dict | None:
    """The choices of the model's kernel profile (its row check's outcome left out: with or
    without speculation, a profile writes the same tokens)."""
    if model.profile is None:
        return None
    profile = model.profile.as_dict()
    del profile["row_check"], profile["speculation"]
    return profile


def profile_difference(old: dict | None, new: dict | None) -> str | None:
    """What differs between a recorded kernel profile and the current one: the code that
    decides the bits first (profile.py's `code`, with longspec's versions), then the other
    choices; None when nothing does (another version whose code is the same is no
    difference)."""
    old, new = old or {}, new or {}
    changed = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in new.items()
               if k not in ("code", "longspec") and old.get(k) != v]
    if old.get("code") == new.get("code"):
        return f"another kernel profile ({', '.join(changed)})" if changed else None
    versions = (f"longspec {old.get('longspec') or 'unrecorded'} -> {new.get('longspec')}"
                if old.get("longspec") != new.get("longspec")
                else f"longspec {new.get('longspec')} both times, its code edited")
    also = f"; also {', '.join(changed)}" if changed else ""
    return (f"other kernel code (digest {old.get('code') or 'unrecorded'} when written, "
            f"{new.get('code')} now; {versions}{also})")


def setting_difference(recorded: dict, current: dict, profile: bool = True) -> str | None:
    """The first setting that differs, as 'NAME=RECORDED, this command has NAME=CURRENT';
    the kernel profile only when `profile`."""
    for key, new in current.items():
        old = recorded.get(key)
        if key == "kernel_profile":
            if profile and (change := profile_difference(old, new)) is not None:
                return (f"{change}: the tokens from the resume point on would differ from the "
                        "uninterrupted run's; pass --allow-profile-change to continue anyway "
                        "(with other tokens from there on)")
        elif isinstance(old, dict) and isinstance(new, dict) and key == "sampling":
            for sub, value in new.items():
                if old.get(sub) != value:
                    return f"{sub}={old.get(sub)!r}, this command has {sub}={value!r}"
        elif old != new:
            if key in ("model", "draft_model"):
                return f"another {key.replace('_', ' ')} (fingerprint {old}, this command's {new})"
            return f"{key}={old!r}, this command has {key}={new!r}"
    return None


@dataclass(frozen=True)
class RunRecord:
    settings: dict
    prompt_ids: list[int]
    token_ids: list[int]
    prefix_bytes: int
    finished: bool = False
    finish_reason: str | None = None
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": FORMAT, "settings": self.settings, "info": self.info,
                "prompt_ids": self.prompt_ids, "token_ids": self.token_ids,
                "prefix_bytes": self.prefix_bytes, "finished": self.finished,
                "finish_reason": self.finish_reason}


def read_record(path: Path) -> RunRecord | None:
    """The record in a sidecar; None when there is none; ValueError when it is not one."""
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        if d.get("format") != FORMAT:
            raise ValueError(f"format {d.get('format')!r}")
        record = RunRecord(d["settings"], d["prompt_ids"], d["token_ids"], d["prefix_bytes"],
                           d["finished"], d["finish_reason"], d.get("info", {}))
        ok = (isinstance(record.settings, dict) and isinstance(record.token_ids, list)
              and isinstance(record.prompt_ids, list) and isinstance(record.prefix_bytes, int))
        if not ok:
            raise ValueError("fields of the wrong type")
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a longspec run sidecar ({e}); delete it to start "
                         "over") from None
    return record


def write_record(path: Path, record: RunRecord) -> None:
    """Replace the sidecar atomically: whoever reads it (or a killed run's successor) sees the
    previous record or this one, whole."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record.to_json(), f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Checkpoints:
    """Writes a run's record as tokens are committed, at most once per `every_s` seconds (a
    killed run loses at most that much work), and always at the end."""

    def __init__(self, path: Path, record: RunRecord, every_s: float):
        self.path = path
        self.record = record
        self.every_s = every_s
        self.last = float("-inf")

    def update(self, token_ids: list[int], force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every_s:
            self.record = RunRecord(self.record.settings, self.record.prompt_ids, list(token_ids),
                                    self.record.prefix_bytes, info=self.record.info)
            write_record(self.path, self.record)
            self.last = now

    def finish(self, token_ids: list[int], finish_reason: str) -> None:
        r = self.record
        self.record = RunRecord(r.settings, r.prompt_ids, list(token_ids), r.prefix_bytes, True,
                                finish_reason, r.info)
        write_record(self.path, self.record)

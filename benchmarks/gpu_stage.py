"""Stage the device check's model on a GPU machine that can download nothing and takes at
most 64 MiB a call, the working tree (~32 MB) included: the SmolLM2 GGUF travels in parts of
PART_MB over consecutive calls (what an earlier call left stays while the machine is warm),
and the `gguf` wheel (transformers and longspec read GGUF files with it) with the first.

Here:

    python benchmarks/gpu_stage.py prepare      # .stage/: the parts, their digests, the wheel

then one device call per part, each carrying only its own (`carry: [".stage/part-1"]`, ...;
the first also carries the wheel), and in the last:

    python benchmarks/gpu_stage.py join && PYTHONPATH=.:/tmp/site python benchmarks/gpu_check.py \\
        --model .stage/smollm2.gguf --out $OUT/gpu_check.json

`join` checks every part's sha256 and the whole file's, installs the wheel into /tmp/site, and
says exactly what is missing when a part did not arrive.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

STAGE = Path(".stage")
PART_MB = 25
MODEL = "smollm2.gguf"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def prepare(model: str) -> None:
    from longspec.models.sources import fetch_model

    source = Path(model) if Path(model).is_file() else fetch_model(model)
    parts = split(source, STAGE, PART_MB << 20)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "-q", "-d", str(STAGE), f"gguf=={metadata.version('gguf')}"], check=True)
    wheel = next(STAGE.glob("gguf-*.whl"))
    print(f"{len(parts)} parts of {source.name} in {STAGE}/, and {wheel.name}; carry, in "
          "consecutive device calls:")
    for i, part in enumerate(parts):
        extra = [str(wheel), str(STAGE / "manifest.json")] if i == 0 else []
        print("  ", json.dumps([str(STAGE / part), *extra]))


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
    args = p.parse_args()
    if args.step == "prepare":
        prepare(args.model)
        return
    out = join(STAGE)
    install_wheels(STAGE)
    print(f"{out}: {out.stat().st_size} bytes, sha256 checked; wheels in /tmp/site")


if __name__ == "__main__":
    main()

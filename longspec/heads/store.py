"""Trained drafters on disk: a directory with `<kind>.safetensors` and `<kind>.json`, the JSON
holding the drafter's shape, a format version, the base model's fingerprint and the training
record. A drafter trained for another model is refused; bundled drafters are found by the base
model's fingerprint under `longspec/zoo/drafters/<fingerprint>/<kind>/` (the demo model's
heads also in their original place, `longspec/zoo/demo/heads/`), and drafters trained on this
machine under `$LONGSPEC_HOME/drafters/<fingerprint>/` (`longspec train-drafter`'s default
place).
"""

from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path

import torch

KINDS = ("eagle", "heads")
ZOO_DRAFTERS = Path(__file__).resolve().parent.parent / "zoo" / "drafters"


# by the loaded network, whose weights do not change: reading the probe costs ~2 ms, paid
# twice by every `auto` generation otherwise (its drafter looked up)
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fingerprint(model) -> str:
    """Identifies the base model by its shape and the signs of some of its weights (signs
    survive loading a checkpoint in another dtype, or quantized; values would not). The
    embedding and the final norm are dense in every load (for tied embeddings this probe is
    the one earlier versions took from the LM head)."""
    found = _FINGERPRINTS.get(model.net)
    if found is None:
        found = _FINGERPRINTS[model.net] = _fingerprint(model)
    return found


def _fingerprint(model) -> str:
    c = model.config
    net = model.net
    probe = torch.cat([net.embed[:4].flatten(), net.norm.flatten(), net.embed[-4:].flatten()])
    signs = "".join("1" if v > 0 else "0" for v in probe.float().tolist())
    text = json.dumps([c.model_type, c.vocab_size, c.hidden_size, c.num_layers, signs])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def files(path: Path, kind: str) -> tuple[Path, Path]:
    """The JSON and the weights of a drafter of `kind` in directory `path`."""
    return path / f"{kind}.json", path / f"{kind}.safetensors"


def train_hint(kind: str) -> str:
    return (f"run 'longspec train-drafter MODEL --kind {kind} --sharegpt TOKENS' (or --data "
            "FILE...), which puts it where the model's methods find it")


def save(out_dir: str | Path, kind: str, module: torch.nn.Module, model, meta: dict) -> None:
    """Write the module's weights (bfloat16: drafts need no more, and bundled drafters stay
    small; integer buffers as they are) and `meta` with the base model's fingerprint."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path, weights = files(out_dir, kind)
    state = {k: (v.detach().bfloat16() if v.is_floating_point() else v).contiguous().cpu()
             for k, v in module.state_dict().items()}
    save_file(state, str(weights))
    meta = {**meta, "base_fingerprint": fingerprint(model), "base_model": model.name}
    cfg_path.write_text(json.dumps(meta, indent=1) + "\n")


def read(path: str | Path, kind: str, model) -> tuple[dict, dict[str, torch.Tensor]]:
    """The JSON and weights of the drafter of `kind` in `path`, checked against `model`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    cfg_path, weights = files(path, kind)
    if not cfg_path.is_file() or not weights.is_file():
        other = [k for k in KINDS if k != kind and files(path, k)[0].is_file()]
        held = f"it holds a drafter of kind {other[0]!r}" if other else "it holds none"
        raise ValueError(f"{path} holds no {kind} drafter ({cfg_path.name} and {weights.name}): "
                         f"{held}; {train_hint(kind)}")
    try:
        meta = json.loads(cfg_path.read_text())
        if not isinstance(meta, dict) or int(meta["hidden_size"]) < 1:
            raise ValueError("no hidden_size")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{cfg_path} is not a valid {kind} config: {e}") from None
    if (int(meta["hidden_size"]) != model.config.hidden_size
            or meta.get("base_fingerprint") != fingerprint(model)):
        raise ValueError(f"the {kind} drafter in {path} was trained for another model "
                         f"({meta.get('base_model')!r}); {train_hint(kind)} for this one")
    try:
        return meta, load_file(str(weights))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"cannot load {weights}: {e}") from None


def load_into(module: torch.nn.Module, state: dict, path: str | Path, kind: str, model):
    """`module` holding the drafter's weights, frozen, on the model's device and dtype."""
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"cannot load {files(Path(path), kind)[1]}: {e}") from None
    module.requires_grad_(False)
    return module.to(device=model.device, dtype=model.dtype).eval()


def resolve(model, given, kind: str, what: str, module_type: type, load):
    """The trained drafter of `kind` (`what`, for messages) for `model`: `given` as a loaded
    module of `module_type`, a directory read with `load(path, model)`, or None for the one
    bundled for the model."""
    if isinstance(given, module_type):
        return given.to(device=model.device, dtype=model.dtype)
    path = given if given is not None else find_bundled(model, kind)
    if path is None:
        raise ValueError(f"this method needs {what}: pass heads=PATH (--heads PATH), or "
                         f"{train_hint(kind)}")
    return load(path, model)


def user_dir(model) -> Path:
    """Where drafters trained here for `model` go by default, and are found."""
    from ..models.sources import longspec_home

    return longspec_home() / "drafters" / fingerprint(model)


def find_bundled(model, kind: str) -> Path | None:
    """A bundled drafter of `kind` for `model`, else one trained here into `user_dir`, or
    None."""
    candidates = [ZOO_DRAFTERS / fingerprint(model) / kind, user_dir(model)]
    if kind == "heads":
        from ..models.loader import demo_path

        demo = demo_path("demo")
        if Path(model.path).resolve() == demo.resolve():
            candidates.insert(0, demo.parent / "heads")
    return next((p for p in candidates if files(p, kind)[0].is_file()), None)

"""The kernel profile: every choice that changes the bits of a forward, fixed when a model loads.

A token's logits must be bitwise the same whether it is computed alone, as a row of a draft
tree, early in a short run or late in a long one (docs/design.md, "What exactness rests on").
That holds within one profile: the same model on the same kernels makes the same choices at
every position, never by a run's length. Another profile (another instruction set, another
torch, the compiled layers or not, another version of the code that computes them) gives other
bits and so, sooner or later, other tokens. So the profile is named in full, recorded with every
run (stats, the sidecar, the server) and compared on resume.

Switches that choose a profile (docs/models.md, "Kernel profiles"):
- LONGSPEC_NATIVE=0: no compiled code (native.py): the Python layers, attention as products,
  ATen's int4 kernel.
- ATEN_CPU_CAPABILITY=avx2 | avx512 | default: PyTorch's kernels, and the compiled layers'
  build, act as that CPU.
- ONEDNN_MAX_CPU_ISA=AVX2 | AVX512_CORE | ...: oneDNN (the dense products) acts as that CPU.
- LONGSPEC_ATTENTION=products | triton: attention as products (attention.py) or in the Triton
  kernel (tree_attention.py; the default on CUDA where Triton is installed).
"""

from __future__ import annotations

import ast
import functools
import hashlib
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch

from ..cache.base import CHUNK
from . import linear
from .compiled import SOURCES, cpu_isa, onednn_max_isa
from .linear import Int4Linear

# The code, relative to the package, whose change may change the bits of a forward or the token
# chosen from them: the compiled kernels (compiled.SOURCES) and these modules with every module
# of the package they import (arithmetic()): the layer and its products, attention, rotations
# and prefill, the caches' layout, how weights are decoded and quantized, the one path from
# logits to a token (processing, noise, penalty, the grammar's masks) and the tool calls'
# grammar. Not the drafters, sizing or verification: over row-invariant forwards
# (verify="match") they change how many tokens a step takes, never which.
ARITHMETIC_ROOTS = ("models/transformer.py", "models/prefill.py", "models/build.py",
                    "models/gguf.py", "models/quant.py", "cache/full.py", "sampling/sampler.py",
                    "outputs/tools.py")
PACKAGE = Path(__file__).parent.parent


def package_imports(module: str) -> set[str]:
    """The package's modules (paths relative to it) that `module` imports by relative import."""
    tree = ast.parse((PACKAGE / module).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = Path(module).parent
            for _ in range(node.level - 1):
                base = base.parent
            where = base.joinpath(*node.module.split(".")) if node.module else base
            named = [where / f"{alias.name}.py" for alias in node.names]
            for path in [where.with_suffix(".py"), *named] if node.module else named:
                if (PACKAGE / path).is_file():
                    found.add(path.as_posix())
    return found


@functools.cache
def arithmetic() -> tuple[str, ...]:
    """The files of the code that decides the bits, sorted: compiled.SOURCES, ARITHMETIC_ROOTS
    and every module of the package they import."""
    seen, todo = set(), list(ARITHMETIC_ROOTS)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += package_imports(module)
    return tuple(sorted(seen | {f"models/{name}" for name in SOURCES}))


@dataclass(frozen=True)
class KernelProfile:
    device: str          # "cpu", or the CUDA device's name
    isa: str             # the CPU kernels: AMX, AVX512, AVX2 or DEFAULT ("" on CUDA)
    onednn_max_isa: str  # ONEDNN_MAX_CPU_ISA ("ALL": what the CPU has)
    torch: str           # PyTorch's version
    longspec: str        # longspec's version
    code: str            # a digest of the code that decides the bits (arithmetic())
    weights: str         # the matrices: int4 (4- and 8-bit codes) or a dtype
    dtype: str           # the activations
    layers: str          # "compiled" (native.cpp) or "python"
    # "loops" (native.cpp, every length), "triton" (tree_attention.py) or "products"
    # (attention.py)
    attention: str
    # "int4_mm" (int4_mm.cpp, AVX2 or AVX-512), "aten", or ""
    # without int4 weights; "+" joins several (a matrix whose shape int4_mm does not take, one
    # of fewer than 16 outputs or a multiple of 16 plus some, runs on ATen's)
    int4_kernel: str
    rows: str            # the row rules that keep products batch-invariant (linear.py)
    # the load-time row check (selfcheck.py): "passed", or what failed and what was done
    row_check: str = "not run"
    # "on", or "off (why): ..." where no kernel path passed the row check: every method then
    # decodes as `ar` (api.py)
    speculation: str = "on"

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One line: where it runs and on which kernels."""
        where = f"{self.device} {self.isa}" if self.isa else self.device
        int4 = f", int4 on {self.int4_kernel}" if self.int4_kernel else ""
        return (f"{where}, torch {self.torch}, {self.weights} weights, {self.dtype} activations, "
                f"{self.layers} layers, attention as {self.attention}{int4}")


def kernel_profile(net, row_check: str = "not run", speculation: str = "on") -> KernelProfile:
    """The profile a loaded network runs with."""
    cpu = net.device.type == "cpu"
    int4 = [m for m in net.modules() if isinstance(m, Int4Linear)]
    dtype = str(net.dtype).removeprefix("torch.")
    return KernelProfile(
        device="cpu" if cpu else torch.cuda.get_device_name(net.device),
        isa=cpu_isa() if cpu else "", onednn_max_isa=onednn_max_isa() if cpu else "",
        torch=torch.__version__, longspec=version(), code=code_digest(),
        weights="int4" if int4 else dtype, dtype=dtype,
        layers="compiled" if net.native is not None else "python",
        attention=net.attention,
        int4_kernel=int4_kernel(int4),
        rows=cpu_rows() if cpu else f"chunk={CHUNK} cuda_rows={linear.CUDA_ROWS}",
        row_check=row_check, speculation=speculation)


def version() -> str:
    """longspec's version as installed ("unknown" run from a source tree not installed)."""
    try:
        return metadata.version("longspec")
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def code_digest() -> str:
    """A digest of the arithmetic() files, names and bytes."""
    digest = hashlib.sha256()
    for name in arithmetic():
        digest.update(f"{name}\0".encode())
        digest.update((PACKAGE / name).read_bytes())
    return digest.hexdigest()[:16]


def cpu_rows() -> str:
    """The CPU's row rules (linear.py): inner products' fewest rows, the rows under which
    bfloat16 products skip oneDNN, their parts' rows, and bfloat16 products as inner products
    where the CPU has AVX-512 without bfloat16 instructions."""
    rules = (f"chunk={CHUNK} fp32_min_rows={linear.MIN_ROWS} "
             f"onednn_min_work={linear.ONEDNN_MIN_WORK} max_rows={linear.MAX_ROWS}")
    if linear.inner_products(torch.bfloat16, torch.device("cpu")):
        rules += " bf16=inner_product"
    return rules


def int4_kernel(modules: list[Int4Linear]) -> str:
    """The int4 kernels `modules` run on (KernelProfile.int4_kernel)."""
    kinds = {"int4_mm" if m.int4_mm else "aten" for m in modules}
    return "+".join(k for k in ("int4_mm", "aten") if k in kinds)

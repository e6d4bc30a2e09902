"""native.cpp and int4_mm.cpp, compiled on first use against the installed PyTorch
(torch.utils.cpp_extension; ~40 s once, then cached in PyTorch's extensions directory, one build
per CPU instruction set). int4_mm.cpp registers the operator longspec::int4_mm with PyTorch's
dispatcher (a CPU kernel and a meta one for its output's shape).
Without a C++ compiler, or with LONGSPEC_NATIVE=0 in the environment, nothing is compiled: the
layers run in Python and int4 products on ATen's kernel. Either is another kernel profile
(profile.py): other bits, so other tokens sooner or later, and recorded as such.
With LONGSPEC_REQUIRE_COMPILED=1 (CI) a build that fails, or one for AVX2 or AVX-512 without
longspec::int4_mm, is an error instead of a warning, so that the compiled code's tests fail
rather than skip. LONGSPEC_NATIVE=0 wins over it: asking for no compiled code is a choice, not a
failed build."""

from __future__ import annotations

import functools
import os
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

# The vector instructions the build may use, by what PyTorch found this CPU to have. The attention
# loops' results do not depend on them (each lane's operations in a fixed order, every fused
# multiply-add written out, none contracted by the compiler), except for bfloat16 dot products
# (BF16_FLAGS); the build's name does, so that a build directory shared by machines with other
# CPUs never runs one's instructions on the other.
ISA_FLAGS = {"AVX512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma",
                        "-mf16c"],
             "AVX2": ["-mavx2", "-mfma", "-mf16c"]}
SOURCES = ("native.cpp", "int4_mm.cpp")

# AVX-512 CPUs with VNNI sum int4_mm's integer products in one instruction (the same sums)
VNNI_FLAGS = ["-mavx512vnni"]
# ... and those with bfloat16 dot products (AVX512_BF16: AMX CPUs, Zen 4 and later) score keys
# with them: other sums than fused multiply-adds, so a profile of their own
BF16_FLAGS = ["-mavx512bf16"]

# A build takes a minute or two; its lock file, older than this, was left by a build that was
# killed (PyTorch would wait for it to go forever).
STALE_LOCK_S = 600


def onednn_max_isa() -> str:
    """ONEDNN_MAX_CPU_ISA, upper case ("ALL" when unset: what the CPU has)."""
    return os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()


def _supported(feature: str) -> bool:
    """torch.cpu._is_<feature>_supported() (private, may go: False then)."""
    return getattr(torch.cpu, f"_is_{feature}_supported", lambda: False)()


def cpu_isa() -> str:
    """The instruction set the CPU kernels act as: "AMX" (AVX-512 with AMX tiles),
    "AVX512_BF16" (AVX-512 with VNNI and bfloat16 dot products), "AVX512", "AVX2" or "DEFAULT",
    as PyTorch found the CPU (ATEN_CPU_CAPABILITY lowers it); AMX and BF16 only where
    ONEDNN_MAX_CPU_ISA leaves oneDNN them (unset, ALL, or a level that names them:
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI acts as an AVX-512 CPU without)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX512":
        return capability
    limit = onednn_max_isa()
    every = limit in ("ALL", "DEFAULT")
    if (every or "AMX" in limit) and _supported("amx_tile"):
        return "AMX"
    if (every or "AMX" in limit or "BF16" in limit) and _supported("avx512_bf16") \
            and _supported("vnni"):
        return "AVX512_BF16"
    return capability


def _instruction_set() -> tuple[str, list[str]]:
    """(the build's name suffix, its compiler flags)."""
    isa = cpu_isa()
    if isa in ("AMX", "AVX512_BF16"):
        isa = "AVX512"
        if _supported("avx512_bf16") and _supported("vnni"):   # AMX's kernels: the same bits
            return "avx512_bf16", ISA_FLAGS[isa] + VNNI_FLAGS + BF16_FLAGS
    if isa == "AVX512" and _supported("vnni"):
        return "avx512_vnni", ISA_FLAGS[isa] + VNNI_FLAGS
    return isa.lower(), ISA_FLAGS.get(isa, [])


def compiled_required() -> bool:
    """Whether LONGSPEC_REQUIRE_COMPILED=1: a build that fails is an error."""
    return os.environ.get("LONGSPEC_REQUIRE_COMPILED", "0") == "1"


@functools.cache
def extension() -> ModuleType | None:
    """The compiled module, or None where LONGSPEC_NATIVE=0, or where it cannot be built: with
    one warning saying why, or a RuntimeError where `compiled_required()`."""
    if os.environ.get("LONGSPEC_NATIVE", "1") == "0":
        return None
    suffix, flags = _instruction_set()
    built = _build(suffix, tuple(flags))
    if isinstance(built, ModuleType):
        if compiled_required() and suffix != "default" and not int4_mm_built():
            raise RuntimeError(f"longspec's compiled kernels were built for {suffix} without "
                               "longspec::int4_mm (int4_mm.cpp compiled without AVX2, F16C and "
                               "FMA); LONGSPEC_REQUIRE_COMPILED=1 makes that an error")
        return built
    compiler = ("g++ 10 or later, which this CPU's bfloat16 instructions need"
                if BF16_FLAGS[0] in flags else "g++")
    if compiled_required():
        raise RuntimeError(f"longspec's compiled kernels could not be built ({built}); "
                           "LONGSPEC_REQUIRE_COMPILED=1 makes that an error: install a C++ "
                           f"compiler ({compiler}) and ninja, or unset LONGSPEC_REQUIRE_COMPILED "
                           "to run the layers in Python") from built
    warnings.warn(f"longspec's compiled kernels could not be built ({built}); quantized models "
                  "run in Python (slower on a CPU, and another kernel profile: tokens may "
                  "differ from runs with the compiled layers). Install a C++ compiler "
                  f"({compiler}) to enable them, or set LONGSPEC_NATIVE=0 to skip this "
                  "attempt.", stacklevel=2)
    return None


@functools.cache
def _build(suffix: str, flags: tuple[str, ...]) -> ModuleType | Exception:
    """The build for this instruction set, or the error that stopped it (kept: a build that
    failed is not tried again in this process)."""
    from torch.utils import cpp_extension
    name = f"longspec_native_{suffix}"
    # where `load` keeps the build (the one place that knows its layout, though private)
    build = Path(cpp_extension._get_build_directory(name, verbose=False))
    _clear_stale_lock(build / "lock")
    if not (build / f"{name}.so").exists():
        print("longspec: compiling the kernels for quantized models (once, ~40 s)",
              file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(
            name, [str(Path(__file__).with_name(f)) for f in SOURCES],
            extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp", *flags],
            extra_ldflags=["-fopenmp"])
    except (RuntimeError, OSError, ImportError) as e:   # no compiler or ninja; a broken build
        return e


def _clear_stale_lock(lock: Path) -> None:
    """Removes a build's lock file that outlived any build; says why the load waits on a
    recent one."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        print(f"longspec: removing {lock}, left by an interrupted build", file=sys.stderr,
              flush=True)
        lock.unlink(missing_ok=True)
    else:
        print(f"longspec: waiting for another process's build of the kernels ({lock}; if no "
              "build runs, delete that file)", file=sys.stderr, flush=True)


def int4_mm_built() -> bool:
    """Whether the loaded build defines longspec::int4_mm (builds for AVX2 and up do)."""
    return hasattr(torch.ops.longspec, "int4_mm")


@functools.cache
def int4_mm() -> bool:
    """Whether int4 products run on longspec::int4_mm here: a build for AVX2 or AVX-512 (CPUs
    with AMX tiles included: the same instructions, so the same bits, as one without)."""
    return extension() is not None and int4_mm_built()

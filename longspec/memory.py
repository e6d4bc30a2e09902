"""Free memory on a device, and human-readable sizes, for checks made before allocating."""

from __future__ import annotations

import os
import resource

import torch


def available_bytes(device: torch.device) -> int:
    """Bytes that can still be allocated on `device` (CUDA: free device memory; CPU: the
    kernel's MemAvailable estimate)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def peak_bytes(device: torch.device) -> int:
    """Peak memory: CUDA's peak allocation since the last reset, or the process's peak
    resident set size on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def format_bytes(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:.1f} {unit}"


def ensure_fits(need: int, device: torch.device, what: str, fix: str) -> None:
    """Raise ValueError before allocating `need` bytes when the device has not that much free
    (a tenth is kept in reserve)."""
    free = available_bytes(device)
    if need > 0.9 * free:
        raise ValueError(f"{what} needs {format_bytes(need)} but {format_bytes(free)} is free on "
                         f"{device}; {fix}")

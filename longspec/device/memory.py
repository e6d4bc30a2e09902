"""Free memory on a device, and human-readable sizes, for checks made before allocating; host
values uploaded to a device without waiting for it."""

from __future__ import annotations

import os
import threading

import torch
from typing_extensions import Self


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


def upload(values: list | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host values (a list of ints, or a CPU tensor) on `device`. On a GPU the copy goes
    through pinned memory without blocking: it queues behind the work already issued, where a
    copy from pageable memory would first wait for that work (a host sync)."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


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


class PeakMemory:
    """Peak memory during a block (one generation): on CUDA the peak allocation since the
    block began; on the CPU the process's resident set, sampled every 5 ms, which includes the
    loaded models and everything else the process holds."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> Self:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.peak = self._rss()
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()
        return self

    def so_far(self) -> int:
        """The peak since the block began, read now."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return max(self.peak, self._rss())

    def __exit__(self, kind, *exc) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            # a generation abandoned unfinished (a stream closed, perhaps as the interpreter
            # exits, when files can no longer be opened) reports no peak
            if kind is not GeneratorExit:
                self.peak = max(self.peak, self._rss())

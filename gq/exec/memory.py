"""Memory figures of the calling process: CUDA allocator stats on GPUs, RSS on the cpu device."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class MemorySample:
    persistent: int  # held between iterations: model, optimizer state
    peak: int  # the most held during the iteration just ended


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _cuda_in_use():
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def sample() -> MemorySample:
    """Sample at a release and reset the peak so the next sample covers one iteration."""
    cuda = _cuda_in_use()
    if cuda is None:
        rss = rss_bytes()
        return MemorySample(persistent=rss, peak=rss)
    persistent, peak = cuda.memory_allocated(), cuda.max_memory_allocated()
    cuda.reset_peak_memory_stats()
    return MemorySample(persistent=persistent, peak=peak)


def release_cached() -> None:
    """Return a parked worker's cached CUDA blocks so lane-mates can use the room."""
    cuda = _cuda_in_use()
    if cuda is not None:
        cuda.empty_cache()

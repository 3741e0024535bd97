"""Memory figures of the calling process: CUDA allocator stats on GPUs, RSS on the cpu device."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import NamedTuple

from gq.exec.lane import device_sync

_PAGE = os.sysconf("SC_PAGE_SIZE")
# What the allocators say they were asked for: CUDA's caching allocator ("Tried to allocate
# 2.00 GiB") and PyTorch's CPU allocator ("you tried to allocate 1048576 bytes").
_CUDA_ASKED = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_CPU_ASKED = re.compile(r"can't allocate memory: you tried to allocate ([0-9]+) bytes")
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


@dataclass(frozen=True)
class MemorySample:
    persistent: int  # held between iterations: model, optimizer state
    peak: int  # the most held so far (on a GPU, reserved: it never goes down)


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _cuda_in_use():
    return device_sync.cuda()


def peak_rss_bytes() -> int | None:
    """The most resident memory the process has held so far (the kernel's high-water mark,
    never reset: a script may read it itself, as ``ru_maxrss``); None where unreadable."""
    try:
        with open("/proc/self/status", "rb") as status:
            found = next((line for line in status if line.startswith(b"VmHWM:")), None)
    except OSError:
        return None
    return int(found.split()[1]) * 1024 if found is not None else None


def sample() -> MemorySample:
    """Sample at a release: what it holds now, and the most it has held so far. On a GPU
    the peak is what the allocator reserved (the cap, ``set_per_process_memory_fraction``,
    holds reserved memory, and cached blocks are the device's all the same), and it is never
    reset: the script's own peak statistics, which training frameworks log, stay its own.
    On the cpu device it is the process's high-water mark (allocations freed before the
    release count too)."""
    cuda = _cuda_in_use()
    if cuda is None:
        rss = rss_bytes()
        return MemorySample(persistent=rss, peak=max(rss, peak_rss_bytes() or 0))
    persistent = cuda.memory_allocated()
    return MemorySample(persistent=persistent, peak=max(persistent, cuda.max_memory_reserved()))


class Shortage(NamedTuple):
    """What a process held and asked for (None: it did not say) when it ran out of memory:
    the worker's OutOfMemory message."""

    held: int
    wanted: int | None


def release_cached() -> None:
    """Return a parked worker's cached CUDA blocks so lane-mates can use the room."""
    cuda = _cuda_in_use()
    if cuda is not None:
        cuda.empty_cache()


def shortage(exc: BaseException | None) -> Shortage | None:
    """Whether an exception that ends a script is an out-of-memory error (torch's
    ``OutOfMemoryError``, its CPU allocator's refusal, or ``MemoryError``), here or among its
    causes; then what the process held and asked for, as its host is told."""
    torch = sys.modules.get("torch")
    device_error = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    cuda = _cuda_in_use()
    seen = 0
    while exc is not None and seen < 8:
        text = str(exc)[:4096]
        if isinstance(device_error, type) and isinstance(exc, device_error):
            held = cuda.memory_reserved() if cuda is not None else rss_bytes()
        elif cuda is None and (
            isinstance(exc, MemoryError)
            or (isinstance(exc, RuntimeError) and _CPU_ASKED.search(text))
        ):
            held = rss_bytes()  # on the cpu device its host memory is its device memory
        else:  # a GPU job short of host memory is not short of device memory
            exc, seen = exc.__cause__ or exc.__context__, seen + 1
            continue
        asked = _asked(text)
        return Shortage(held, held + asked if asked is not None else None)
    return None


def _asked(text: str) -> int | None:
    found = _CUDA_ASKED.search(text)
    if found is not None:
        return int(float(found.group(1)) * _UNITS[found.group(2)])
    found = _CPU_ASKED.search(text)
    return int(found.group(1)) if found is not None else None


def cap_devices(torch, cap: int) -> None:
    """Hold the process's CUDA allocations to ``cap`` bytes on each device it sees: an
    allocation past it fails with ``OutOfMemoryError`` in this job, not in its neighbours."""

    def apply() -> None:
        for index in range(torch.cuda.device_count()):
            total = torch.cuda.get_device_properties(index).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), index)

    # When CUDA starts, not at import: the script may still set CUDA_VISIBLE_DEVICES or
    # PYTORCH_CUDA_ALLOC_CONF, or never use CUDA at all.
    lazy = getattr(torch.cuda, "_lazy_call", None)
    if lazy is not None:
        lazy(apply)
    elif torch.cuda.is_available():
        apply()

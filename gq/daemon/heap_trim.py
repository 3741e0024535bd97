"""Handing freed heap memory back to the system, so that a daemon that runs for months stays
its warm size.

Each job leaves the daemon's heap fragmented a little (rows read, messages decoded, then
freed). glibc's malloc keeps such freed pages as its own rather than returning them, and the
daemon's RSS grew by about 5 KB per finished job; ``malloc_trim(0)`` returns them, and with it
the RSS stays where it was once warm (bench/soak.py). Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes


def _trim():
    """glibc's malloc_trim, from the C library the interpreter runs on (None elsewhere)."""
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


_MALLOC_TRIM = _trim()


def give_back() -> None:
    """Return the heap's free pages to the system (a few milliseconds)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)

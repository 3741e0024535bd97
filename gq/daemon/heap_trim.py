"""Handing freed heap memory back to the system, so that a daemon that runs for months stays
its warm size; and what the daemon holds (``gq info`` shows it).

Each job leaves the daemon's heap fragmented a little (rows read, messages decoded, then
freed). glibc's malloc keeps such freed pages as its own rather than returning them, and the
daemon's RSS grew by about 5 KB per finished job; ``malloc_trim(0)`` returns them, and with it
the RSS stays where it was once warm (bench/soak.py). Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os


def _trim():
    """glibc's malloc_trim, from the C library the interpreter runs on (None elsewhere)."""
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


_MALLOC_TRIM = _trim()


def _sqlite_memory_used():
    """SQLite's sqlite3_memory_used, from the library Python's sqlite3 runs on (None where
    it cannot be found: a copy linked into the module itself)."""
    import _sqlite3

    for name in (_sqlite3.__file__, ctypes.util.find_library("sqlite3")):
        try:
            function = ctypes.CDLL(name).sqlite3_memory_used
        except (OSError, AttributeError, TypeError):
            continue
        function.argtypes, function.restype = [], ctypes.c_int64
        return function
    return None


_SQLITE_MEMORY_USED = _sqlite_memory_used()
_PAGE = os.sysconf("SC_PAGE_SIZE")


def give_back() -> None:
    """Return the heap's free pages to the system (a few milliseconds)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def resident() -> int:
    """This process's resident set, in bytes (0 where /proc cannot tell)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def sqlite_bytes() -> int | None:
    """What SQLite holds in this process (the daemon's connection: its page cache, its
    prepared statements); None where that cannot be asked."""
    return None if _SQLITE_MEMORY_USED is None else int(_SQLITE_MEMORY_USED())

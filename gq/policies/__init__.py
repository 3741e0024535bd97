"""Scheduling policies: ``fifo``, ``srtf``, ``fair``, ``priority``, ``rr``, ``deadline`` (see
base.Policy)."""

from __future__ import annotations

from gq.policies.base import JobView, Policy
from gq.policies.deadline import Deadline
from gq.policies.fair import Fair
from gq.policies.fifo import Fifo
from gq.policies.priority import FILL_MODES, Priority
from gq.policies.rr import DEFAULT_QUANTUM, RoundRobin
from gq.policies.srtf import Srtf

NAMES = ("fifo", "srtf", "fair", "priority", "rr", "deadline")

__all__ = ["NAMES", "FILL_MODES", "DEFAULT_QUANTUM", "JobView", "Policy", "label", "make"]


def label(name: str, fill: str, quantum: str) -> str:
    """How people see a policy setting: ``priority (fill gapfit)``, ``rr (quantum 100ms)``."""
    if name == "priority":
        return f"priority (fill {fill})"
    if name == "rr":
        return f"rr (quantum {quantum})"
    return name


def make(name: str, fill: str = "always", quantum: str = DEFAULT_QUANTUM) -> Policy:
    """The policy ``name``; ``fill`` is priority's, ``quantum`` rr's. ValueError if unknown."""
    if name == "fifo":
        return Fifo()
    if name == "srtf":
        return Srtf()
    if name == "fair":
        return Fair()
    if name == "priority":
        return Priority(fill)
    if name == "rr":
        return RoundRobin(quantum)
    if name == "deadline":
        return Deadline()
    raise ValueError(f"unknown policy {name!r}; use one of {', '.join(NAMES)}")

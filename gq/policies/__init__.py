"""Scheduling policies: ``fifo``, ``srtf``, ``fair``, ``priority`` (see base.Policy)."""

from __future__ import annotations

from gq.policies.base import JobView, Policy
from gq.policies.fair import Fair
from gq.policies.fifo import Fifo
from gq.policies.priority import FILL_MODES, Priority
from gq.policies.srtf import Srtf

NAMES = ("fifo", "srtf", "fair", "priority")

__all__ = ["NAMES", "FILL_MODES", "JobView", "Policy", "make"]


def make(name: str, fill: str = "always") -> Policy:
    if name == "fifo":
        return Fifo()
    if name == "srtf":
        return Srtf()
    if name == "fair":
        return Fair()
    if name == "priority":
        return Priority(fill)
    raise ValueError(f"unknown policy {name!r}; use one of {', '.join(NAMES)}")

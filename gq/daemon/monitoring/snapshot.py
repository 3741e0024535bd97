"""What a Prometheus scrape reports: the node as the last sample saw it, handed from the
daemon's loop (:mod:`gq.daemon.monitoring.monitor`) to the metrics thread
(:mod:`gq.daemon.monitoring.metrics`) whole, once a second."""

from __future__ import annotations

from dataclasses import dataclass, field

from gq.messages import DeviceReading


@dataclass
class LaneState:
    device: str
    lane: int
    residents: int
    held: bool  # a job holds it (runs an iteration) now


@dataclass
class Snapshot:
    jobs: dict[tuple[str, str], int] = field(default_factory=dict)  # (state, user) -> count
    readings: dict[str, DeviceReading] = field(default_factory=dict)
    lanes: list[LaneState] = field(default_factory=list)
    switches: dict[str, int] = field(default_factory=dict)  # per device, since its host began
    guard: dict[str, str] = field(default_factory=dict)  # devices the guard holds, and why

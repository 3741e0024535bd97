"""Admission: which pending jobs become resident on which device and lane (pure).

A job fits a lane while Σ persistent + max ephemeral ≤ lane capacity over the lane's jobs
(the Salus condition), the device's resident cap is not reached, and no exclusive job holds
the device. Jobs are taken in the policy's order; a job that cannot be placed reserves the
devices it could use, so later jobs do not starve it (no backfill).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Footprint:
    persistent: int = 0
    ephemeral: int = 0


@dataclass
class LaneLoad:
    capacity: int
    footprints: list[Footprint] = field(default_factory=list)

    def fits(self, extra: Footprint) -> bool:
        every = self.footprints + [extra]
        need = sum(f.persistent for f in every) + max(f.ephemeral for f in every)
        return need <= self.capacity


@dataclass
class DeviceLoad:
    name: str
    gpu: bool
    lanes: list[LaneLoad]
    max_resident: int
    residents: int = 0
    exclusive: bool = False

    @property
    def empty(self) -> bool:
        return self.residents == 0


@dataclass(frozen=True)
class Request:
    job_id: int
    gpus: int
    footprint: Footprint
    exclusive: bool = False


@dataclass(frozen=True)
class Placement:
    job_id: int
    devices: tuple[str, ...]
    lane: int


def place(ordered: Sequence[Request], devices: Sequence[DeviceLoad]) -> list[Placement]:
    has_gpus = any(d.gpu for d in devices)
    reserved: set[str] = set()
    placements = []
    for request in ordered:
        if request.gpus == 0 or not has_gpus:
            candidates = [d for d in devices if not d.gpu]
        else:
            candidates = [d for d in devices if d.gpu]
        free = [d for d in candidates if d.name not in reserved]
        placement = _place_one(request, free)
        if placement is None:
            reserved.update(d.name for d in candidates)
            continue
        placements.append(placement)
    return placements


def _place_one(request: Request, devices: list[DeviceLoad]) -> Placement | None:
    whole = request.exclusive or request.gpus > 1
    if whole:
        empty = [d for d in devices if d.empty]
        count = max(1, request.gpus)
        if len(empty) < count:
            return None
        chosen = empty[:count]
        for device in chosen:
            device.exclusive = True
            device.residents += 1
        return Placement(request.job_id, tuple(d.name for d in chosen), 0)
    options = []
    for device in devices:
        if device.exclusive or device.residents >= device.max_resident:
            continue
        for index, lane in enumerate(device.lanes):
            if lane.fits(request.footprint):
                options.append((device.residents, len(lane.footprints), device, index, lane))
    if not options:
        return None
    _, _, device, index, lane = min(options, key=lambda o: (o[0], o[1]))
    device.residents += 1
    lane.footprints.append(request.footprint)
    return Placement(request.job_id, (device.name,), index)

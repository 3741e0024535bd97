"""Watching the node: each device sampled once a second, the thermal and power guard fed
from the samples, and the snapshot a Prometheus scrape reads."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gq.daemon.devices import Device
from gq.daemon.monitoring.guard import Guard, Limits
from gq.daemon.monitoring.sampling import Sampler
from gq.daemon.monitoring.snapshot import LaneState, Snapshot
from gq.daemon.supervision.running import Running
from gq.errors import MissingExtra, UserError
from gq.messages import DeviceReading
from gq.queue import stats
from gq.queue.engine import Database

log = logging.getLogger("gq.daemon")

if TYPE_CHECKING:
    from gq.daemon.monitoring.metrics import Metrics


class Monitor:
    def __init__(
        self,
        db: Database,
        devices: list[Device],
        lanes: int,
        limits: Limits,
        readings: str | None,
        wake: Callable[[], None],
        job_of: Callable[[int], int | None] | None = None,
    ):
        self.db = db
        self.devices = devices
        self.lanes = lanes
        self.wake = wake
        self.guard = Guard(limits)
        self.readings: dict[str, DeviceReading] = {}  # the latest sample of each device
        self.sampler = Sampler(devices, Path(readings) if readings else None, job_of)
        self.metrics: Metrics | None = None

    def serve_metrics(self, address: str) -> None:
        """Start the Prometheus endpoint; a daemon that cannot exits at start, saying why."""
        try:
            # prometheus-client is an extra ('gq[metrics]'): imported only where asked for.
            from gq.daemon.monitoring.metrics import Metrics
        except ImportError:
            log.error("cannot serve metrics: %s", MissingExtra("--metrics", "metrics"))
            raise SystemExit(2) from None
        try:
            self.metrics = Metrics(address, self.devices)
        except (OSError, UserError) as exc:
            message = getattr(exc, "strerror", None) or exc
            log.error("cannot serve metrics on %s: %s", address, message)
            raise SystemExit(2) from None

    def sample(self, running: dict[int, Running], switches: dict[str, int]) -> None:
        """Read every device; a device the guard starts or stops holding wakes admission."""
        jobs: dict[str, list[tuple[int, int]]] = {}
        for job in running.values():
            if job.pid is not None:
                for device in job.devices:
                    jobs.setdefault(device.name, []).append((job.job_id, job.pid))
        self.readings = self.sampler.sample(jobs)
        if self.guard.limits.any:
            for name, reading in self.readings.items():
                if self.guard.update(name, reading):
                    if name in self.guard.held:
                        log.warning("guard: %s", self.guard.held[name])
                    else:
                        log.info("guard: %s admits jobs again", name)
                    self.wake()
        if self.metrics is not None:
            self.metrics.snapshot = self._snapshot(running, switches)

    def _snapshot(self, running: dict[int, Running], switches: dict[str, int]) -> Snapshot:
        """What a scrape reports until the next sample."""
        with self.db.read() as session:
            counts = stats.counts_by_state_and_user(session)
        lanes: dict[tuple[str, int], LaneState] = {}
        for device in self.devices:
            for lane in range(self.lanes):
                lanes[device.name, lane] = LaneState(device.name, lane, 0, False)
        for job in running.values():
            for device in job.devices:
                state = lanes[device.name, job.lane]
                state.residents += 1
                state.held |= job.holds_lane
        return Snapshot(
            jobs=counts,
            readings=dict(self.readings),
            lanes=list(lanes.values()),
            switches=dict(switches),
            guard=dict(self.guard.held),
        )

    def close(self) -> None:
        self.sampler.close()
        if self.metrics is not None:
            self.metrics.close()

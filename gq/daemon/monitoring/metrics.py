"""Prometheus metrics (``gq daemon start --metrics ADDR:PORT``), served at ``/metrics`` by
prometheus_client's own thread.

The daemon's loop hands over a :class:`gq.daemon.monitoring.snapshot.Snapshot` once a second and
observes job starts and ends; a scrape only reads the latest snapshot, so it never touches
the queue or the loop.
Device figures carry the names NVIDIA's DCGM exporter gives them, so existing GPU
dashboards work unchanged; everything else is ``gq_*``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gq.daemon.devices import Device
from gq.daemon.monitoring.snapshot import Snapshot
from gq.units import parse_address

WAIT_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600)
RUN_BUCKETS = (10, 60, 300, 900, 3600, 3 * 3600, 12 * 3600, 24 * 3600, 72 * 3600, 168 * 3600)
MIB = 1 << 20


class Metrics:
    def __init__(self, address: str, devices: list[Device]):
        host, port = parse_address(address)
        self.devices = devices
        self.snapshot = Snapshot()
        self.hostname = socket.gethostname()
        self.registry = CollectorRegistry(auto_describe=True)
        self.wait = Histogram(
            "gq_job_wait_seconds",
            "Time from submission to start.",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.run_time = Histogram(
            "gq_job_run_seconds",
            "Time from start to end, by end state.",
            ["state"],
            buckets=RUN_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Collector(self))
        self.server, self.thread = start_http_server(port, host, registry=self.registry)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Collector(Collector):
    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self) -> Iterator:
        snapshot = self.metrics.snapshot  # replaced whole by the loop: read it once
        jobs = GaugeMetricFamily(
            "gq_jobs", "Jobs in the queue by state and user.", labels=["state", "user"]
        )
        for (state, user), count in sorted(snapshot.jobs.items()):
            jobs.add_metric([state, user], count)
        yield jobs
        switches = CounterMetricFamily(
            "gq_lane_switches", "Times a lane passed from one job to another.", labels=["device"]
        )
        for device, count in sorted(snapshot.switches.items()):
            switches.add_metric([device], count)
        yield switches
        residents = GaugeMetricFamily(
            "gq_lane_residents", "Jobs resident on a lane.", labels=["device", "lane"]
        )
        held = GaugeMetricFamily(
            "gq_lane_held",
            "1 while a job runs an iteration on the lane.",
            labels=["device", "lane"],
        )
        for lane in snapshot.lanes:
            residents.add_metric([lane.device, str(lane.lane)], lane.residents)
            held.add_metric([lane.device, str(lane.lane)], int(lane.held))
        yield residents
        yield held
        yield from self._devices(snapshot)

    def _devices(self, snapshot: Snapshot) -> Iterator:
        labels = ["gpu", "UUID", "device", "modelName", "Hostname"]
        families = {
            "utilization": GaugeMetricFamily(
                "DCGM_FI_DEV_GPU_UTIL", "Utilization (in %).", labels=labels
            ),
            "fb_used": GaugeMetricFamily(
                "DCGM_FI_DEV_FB_USED", "Memory used (in MiB).", labels=labels
            ),
            "fb_free": GaugeMetricFamily(
                "DCGM_FI_DEV_FB_FREE", "Memory free (in MiB).", labels=labels
            ),
            "temperature": GaugeMetricFamily(
                "DCGM_FI_DEV_GPU_TEMP", "Temperature (in C).", labels=labels
            ),
            "power": GaugeMetricFamily(
                "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels=labels
            ),
            "power_limit": GaugeMetricFamily(
                "DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power limit (in W).", labels=labels
            ),
            "sm_clock": GaugeMetricFamily(
                "DCGM_FI_DEV_SM_CLOCK", "SM clock (in MHz).", labels=labels
            ),
            "ecc_errors": GaugeMetricFamily(
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                "Uncorrected ECC errors since the driver loaded.",
                labels=labels,
            ),
            "external": GaugeMetricFamily(
                "gq_device_external_memory_bytes",
                "Device memory used by processes gq did not start.",
                labels=labels,
            ),
            "throttled": GaugeMetricFamily(
                "gq_device_throttled",
                "1 per reason the clocks are held down now.",
                labels=[*labels, "reason"],
            ),
            "guard": GaugeMetricFamily(
                "gq_device_guard_held",
                "1 while the thermal and power guard admits no job to the device.",
                labels=labels,
            ),
        }
        for device in self.metrics.devices:
            reading = snapshot.readings.get(device.name)
            if reading is None:
                continue
            values = [
                str(device.index if device.index is not None else 0),
                device.uuid or "",
                device.name,
                device.model,
                self.metrics.hostname,
            ]
            free = (
                None
                if reading.memory_used is None or reading.memory_total is None
                else (reading.memory_total - reading.memory_used) / MIB
            )
            figures = {
                "utilization": reading.utilization,
                "fb_used": None if reading.memory_used is None else reading.memory_used / MIB,
                "fb_free": free,
                "temperature": reading.temperature,
                "power": reading.power,
                "power_limit": reading.power_limit,
                "sm_clock": reading.sm_clock,
                "ecc_errors": reading.ecc_errors,
                "external": reading.external_memory,
                "guard": int(device.name in snapshot.guard),
            }
            for key, value in figures.items():
                if value is not None:
                    families[key].add_metric(values, value)
            for reason in reading.throttle:
                families["throttled"].add_metric([*values, reason], 1)
        yield from families.values()

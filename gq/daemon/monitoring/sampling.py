"""Device sampling: what each device is doing, read once a second by the daemon's loop.

GPUs (and MIG instances) are read through NVML: utilization, memory, temperature, power,
SM clock, throttle reasons, uncorrected ECC errors and the processes on the device, so that
memory held by processes gq did not start counts against admission. The ``cpu`` device and
emulated devices get what psutil offers: the CPU share and resident memory of their jobs'
processes, and the CPU package temperature where the kernel exposes one.

A readings file (``gq daemon start --readings FILE``, JSON lines such as
``{"device": "gpu0", "temperature": 91}``) overlays recorded figures on the sample, the
latest line per device winning: the thermal and power guard is driven through this same
interface in tests and demos.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gq.daemon.devices import Device
from gq.messages import DeviceProcess, DeviceReading

log = logging.getLogger("gq.daemon")

# The figures a readings file may set, and the type each must have.
RECORDED = {
    "utilization": float,
    "memory_used": int,
    "memory_total": int,
    "external_memory": int,
    "temperature": float,
    "power": float,
    "power_limit": float,
    "sm_clock": int,
    "ecc_errors": int,
}


class Sampler:
    """Reads every device; :meth:`sample` takes each device's jobs as (job id, pid)."""

    def __init__(
        self,
        devices: Sequence[Device],
        readings: Path | None = None,
        job_of: Callable[[int], int | None] | None = None,
    ):
        self.devices = list(devices)
        cuda = [d for d in self.devices if d.kind == "cuda"]
        self.nvml = _Nvml(cuda, job_of) if cuda else None
        self.host = _Psutil()
        self.readings = readings
        self._bad_lines: set[int] = set()

    def sample(self, jobs: Mapping[str, Sequence[tuple[int, int]]]) -> dict[str, DeviceReading]:
        now = time.time()
        recorded = self._recorded()
        self.host.begin(now)
        samples = {}
        for device in self.devices:
            mine = jobs.get(device.name, ())
            if device.kind == "cuda" and self.nvml is not None:
                reading = self.nvml.read(device, now, mine)
            else:
                reading = self.host.read(device, now, mine)
            if device.name in recorded:
                reading = _overlay(reading, recorded[device.name])
            samples[device.name] = reading
        return samples

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()

    def _recorded(self) -> dict[str, dict]:
        """The latest recorded figures per device (a line that is not one is skipped, and
        logged once)."""
        if self.readings is None:
            return {}
        try:
            lines = self.readings.read_text().splitlines()
        except OSError as exc:
            if -1 not in self._bad_lines:
                log.warning("cannot read --readings %s: %s", self.readings, exc.strerror)
                self._bad_lines.add(-1)
            return {}
        latest: dict[str, dict] = {}
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                device = record.pop("device")
                figures = {key: RECORDED[key](value) for key, value in record.items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                if number not in self._bad_lines:
                    self._bad_lines.add(number)
                    log.warning(
                        "--readings %s line %d is not a reading; skipped "
                        '(expected {"device": NAME, FIGURE: NUMBER, ...} with '
                        "figures among %s)",
                        self.readings,
                        number,
                        ", ".join(RECORDED),
                    )
                continue
            latest.setdefault(str(device), {}).update(figures)
        return latest


def _overlay(reading: DeviceReading, figures: dict) -> DeviceReading:
    for key, value in figures.items():
        setattr(reading, key, value)
    reading.source = "recorded"
    return reading


class _Psutil:
    """The cpu and emulated devices: their jobs' processes, as psutil sees them."""

    def __init__(self):
        import psutil

        self.psutil = psutil
        # CPU seconds per process at the last sample, and at this one so far: only the
        # processes seen in the last sample are kept, so ended jobs' pids do not pile up.
        self.cpu_seconds: dict[int, float] = {}
        self._sampled: dict[int, float] = {}
        self.last = time.time()
        self.period = 0.0
        self.temperature: float | None = None

    def begin(self, now: float) -> None:
        self.period, self.last = now - self.last, now
        self.cpu_seconds, self._sampled = self._sampled, {}
        self.temperature = self._package_temperature()

    def read(self, device: Device, now: float, jobs: Sequence[tuple[int, int]]) -> DeviceReading:
        busy = 0.0
        rss = 0
        processes = []
        for job_id, pid in jobs:
            for process in self._tree(pid):
                try:
                    with process.oneshot():
                        times = process.cpu_times()
                        memory = process.memory_info().rss
                except self.psutil.Error:
                    continue
                seconds = times.user + times.system
                before = self.cpu_seconds.get(process.pid)
                self._sampled[process.pid] = seconds
                if before is not None:
                    busy += max(0.0, seconds - before)
                rss += memory
                processes.append(DeviceProcess(process.pid, memory, job_id))
        utilization = min(100.0, 100.0 * busy / self.period) if self.period > 0 else None
        return DeviceReading(
            time=now,
            source="psutil",
            utilization=utilization,
            memory_used=rss,
            memory_total=device.memory_total,
            temperature=self.temperature,
            processes=processes,
        )

    def _tree(self, pid: int) -> list:
        try:
            process = self.psutil.Process(pid)
            return [process, *process.children(recursive=True)]
        except self.psutil.Error:
            return []

    def _package_temperature(self) -> float | None:
        try:
            sensors = self.psutil.sensors_temperatures()
        except (AttributeError, OSError):
            return None
        currents = [
            entry.current for entries in sensors.values() for entry in entries if entry.current
        ]
        return max(currents, default=None)


class _Nvml:
    """GPUs and MIG instances through NVML, initialised once for the daemon's life."""

    def __init__(self, devices: Sequence[Device], job_of: Callable[[int], int | None] | None):
        import pynvml

        self.nvml = pynvml
        self.job_of = job_of  # a process's job by its cgroup, where jobs have cgroups
        pynvml.nvmlInit()
        self.handles = {}
        self.boards = {}  # temperature and power are the physical GPU's
        for device in devices:
            board = pynvml.nvmlDeviceGetHandleByIndex(
                device.gpu if device.gpu is not None else device.index
            )
            self.boards[device.name] = board
            self.handles[device.name] = (
                pynvml.nvmlDeviceGetHandleByUUID(device.uuid)
                if device.mig and device.uuid
                else board
            )

    def close(self) -> None:
        self.nvml.nvmlShutdown()

    def read(self, device: Device, now: float, jobs: Sequence[tuple[int, int]]) -> DeviceReading:
        nvml, handle, board = self.nvml, self.handles[device.name], self.boards[device.name]
        memory = self._get(nvml.nvmlDeviceGetMemoryInfo, handle)
        utilization = self._get(nvml.nvmlDeviceGetUtilizationRates, handle)
        power = self._get(nvml.nvmlDeviceGetPowerUsage, board)
        limit = self._get(nvml.nvmlDeviceGetEnforcedPowerLimit, board)
        reasons = self._get(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, board)
        job_of = self._job_finder(jobs)
        processes = [
            DeviceProcess(p.pid, p.usedGpuMemory, job_of(p.pid))
            for p in self._get(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        ]
        return DeviceReading(
            time=now,
            source="nvml",
            utilization=None if utilization is None else float(utilization.gpu),
            memory_used=None if memory is None else int(memory.used),
            memory_total=None if memory is None else int(memory.total),
            external_memory=sum(p.memory or 0 for p in processes if p.job is None),
            temperature=self._get(nvml.nvmlDeviceGetTemperature, board, nvml.NVML_TEMPERATURE_GPU),
            power=None if power is None else power / 1000.0,
            power_limit=None if limit is None else limit / 1000.0,
            sm_clock=self._get(nvml.nvmlDeviceGetClockInfo, board, nvml.NVML_CLOCK_SM),
            throttle=[] if reasons is None else throttle_reasons(nvml, reasons),
            ecc_errors=self._get(
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            ),
            processes=processes,
        )

    def _get(self, call, *args):
        """One figure, or None where the device does not report it (MIG, older boards)."""
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def _job_finder(self, jobs: Sequence[tuple[int, int]]) -> Callable[[int], int | None]:
        """How a process on the device is found to be one of the device's ``jobs``: by its
        cgroup (which holds whatever the job started, daemonised or not), else by the jobs'
        process trees (no cgroups here), each walked once a sample. A process of a job
        placed elsewhere counts as outside gq's jobs here: its memory is this device's."""
        here = {job for job, _ in jobs}
        if self.job_of is not None:
            job_of = self.job_of
            return lambda pid: job if (job := job_of(pid)) in here else None
        import psutil

        tree = {pid: job for job, pid in jobs}
        for job, pid in jobs:
            try:
                tree.update(
                    {child.pid: job for child in psutil.Process(pid).children(recursive=True)}
                )
            except psutil.Error:
                continue
        return tree.get


_THROTTLE = (
    ("nvmlClocksThrottleReasonGpuIdle", "idle"),
    ("nvmlClocksThrottleReasonApplicationsClocksSetting", "app_clocks"),
    ("nvmlClocksThrottleReasonSwPowerCap", "sw_power_cap"),
    ("nvmlClocksThrottleReasonHwSlowdown", "hw_slowdown"),
    ("nvmlClocksThrottleReasonSyncBoost", "sync_boost"),
    ("nvmlClocksThrottleReasonSwThermalSlowdown", "sw_thermal"),
    ("nvmlClocksThrottleReasonHwThermalSlowdown", "hw_thermal"),
    ("nvmlClocksThrottleReasonHwPowerBrakeSlowdown", "hw_power_brake"),
)


def throttle_reasons(nvml, mask: int) -> list[str]:
    """NVML's throttle bit mask as names."""
    return [name for constant, name in _THROTTLE if mask & getattr(nvml, constant, 0)]

"""The daemon's options: what ``gq daemon start`` (or ``python -m gq.daemon``) was given,
and the command line that starts a daemon with them again (``gq daemon restart`` reuses
it; ``gq info`` shows it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gq import defaults
from gq.errors import UserError
from gq.units import describe_period, format_period, parse_seconds

AUTO = "auto"


def parse_lanes(text: str) -> tuple[int, bool]:
    """``--lanes``: ``auto`` (one lane admission fills, several at once where measurement
    says it pays: gq.exec.lane.packing) or a fixed count; (lanes, measured). ValueError: neither."""
    if text.strip().lower() == AUTO:
        return 1, True
    count = int(text)
    if not 1 <= count <= defaults.MAX_LANES:
        raise ValueError(f"--lanes {text}: give 'auto' or a count from 1 to {defaults.MAX_LANES}")
    return count, False


def parse_rotate(text: str) -> float:
    """``--rotate``: how long a resident's turn lasts before it may be rotated out for a job
    that waits for room: seconds (2.5 too), or 90s, 10min, 2hours; more than 0 and at most
    MAX_ROTATE. ValueError: not such a time (0, negative, nan, endless, too long, words)."""
    try:
        seconds = parse_seconds(text, "--rotate")
    except UserError:
        seconds = math.nan
    if not 0 < seconds <= defaults.MAX_ROTATE:
        raise ValueError(
            f"--rotate {text[:40]!r}: give a time of more than 0 and at most "
            f"{describe_period(defaults.MAX_ROTATE)} (30s, 10min, 2hours)"
        )
    return seconds


@dataclass(frozen=True)
class DaemonOptions:
    lanes: int = defaults.LANES
    packing: bool = True  # --lanes auto: lanes at once as measurement says
    max_resident: int = defaults.MAX_RESIDENT
    max_pids: int = defaults.MAX_PIDS  # tasks (processes and threads) a job may have at once
    kill_grace: float = defaults.KILL_WAIT
    cpu_memory: int | None = None  # bytes the cpu device offers jobs [all of RAM]
    cpu_devices: int | None = None  # emulate this many devices on the cpu instead
    device_model: str | None = None  # the emulated devices' model (for --gpus TYPE:N)
    operator_group: str | None = None  # its members may act on every job and the node
    priority_cap: int = defaults.PRIORITY_CAP  # system mode: highest priority for users
    max_temp: float | None = None  # the guard: no new job onto a device hotter than this
    max_power: float | None = None  # ... or drawing more watts than this
    readings: str | None = None  # a file of recorded readings overlaid on the samples
    metrics: str | None = None  # ADDR:PORT to serve Prometheus metrics on
    client_timeout: float = defaults.CONNECTION_IDLE  # drop a client silent this long
    cgroup: str = defaults.CGROUP  # auto | v2 | v1 | off
    retention: float = defaults.RETENTION  # seconds finished jobs are kept
    max_pending: int = defaults.MAX_PENDING_PER_USER
    max_spool: int = defaults.MAX_SPOOL_PER_USER  # bytes of snapshots kept per user
    max_array: int = defaults.MAX_ARRAY_SIZE
    max_connections_per_user: int = defaults.MAX_CONNECTIONS_PER_USER
    max_connections: int = defaults.MAX_CONNECTIONS
    max_request: int = defaults.MAX_REQUEST
    on_finish: str | None = None  # a command run as each job's owner once it has ended
    move_margin: float = defaults.MOVE_MARGIN  # seconds sooner that move an unstarted job
    probe_mem: int = defaults.PROBE_MEMORY  # bytes free a job that declares no memory needs
    probe_wait: float = defaults.PROBE_IDLE_SECONDS  # ... and seconds to its first iteration
    attach_wait: float = defaults.ATTACH_WAIT  # seconds a started terminal waits for its gq
    fair_half_life: float = defaults.FAIR_HALF_LIFE  # a user's usage halves this often
    idle_resident: float = defaults.IDLE_RESIDENT  # seconds before an idle one gives its slot
    checkpoint: str = "auto"  # how suspended jobs' device memory moves (gq.exec.host.checkpoint)
    rotate: float | None = None  # seconds of a resident's turn while others wait (None: off)
    mps: bool = False  # NVIDIA MPS on the CUDA devices (gq.daemon.mps)

    def to_argv(self) -> list[str]:
        """The command-line options that start a daemon with these options."""
        argv = [
            "--lanes",
            AUTO if self.packing else str(self.lanes),
            "--checkpoint",
            self.checkpoint,
            "--max-resident",
            str(self.max_resident),
            "--max-pids",
            str(self.max_pids),
            "--kill-wait",
            str(self.kill_grace),
            "--priority-cap",
            str(self.priority_cap),
            "--client-timeout",
            str(self.client_timeout),
            "--cgroup",
            self.cgroup,
            "--retention",
            format_period(self.retention),
            "--max-pending",
            str(self.max_pending),
            "--max-spool",
            str(self.max_spool),
            "--max-array",
            str(self.max_array),
            "--max-connections-per-user",
            str(self.max_connections_per_user),
            "--max-connections",
            str(self.max_connections),
            "--max-request",
            str(self.max_request),
            "--move-margin",
            str(self.move_margin),
            "--probe-mem",
            str(self.probe_mem),
            "--probe-wait",
            str(self.probe_wait),
            "--attach-wait",
            str(self.attach_wait),
            "--fair-half-life",
            format_period(self.fair_half_life),
            "--idle-resident",
            format_period(self.idle_resident),
        ]
        if self.cpu_memory is not None:
            argv += ["--cpu-memory", str(self.cpu_memory)]
        if self.cpu_devices is not None:
            argv += ["--cpu-devices", str(self.cpu_devices)]
        if self.device_model is not None:
            argv += ["--device-model", self.device_model]
        if self.operator_group is not None:
            argv += ["--operators", self.operator_group]
        if self.on_finish is not None:
            argv += ["--on-finish", self.on_finish]
        if self.rotate is not None:
            argv += ["--rotate", format_period(self.rotate)]
        if self.mps:
            argv.append("--mps")
        for flag, value in (
            ("--max-temp", self.max_temp),
            ("--max-power", self.max_power),
            ("--readings", self.readings),
            ("--metrics", self.metrics),
        ):
            if value is not None:
                argv += [flag, str(value)]
        return argv

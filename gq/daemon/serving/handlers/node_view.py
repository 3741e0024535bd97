"""The daemon as request handlers see it: the few things they read and the two they ask
(:class:`NodeView`). The daemon (:mod:`gq.daemon.node`) is one; a handler imports nothing
else of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gq.daemon.devices import Device
    from gq.daemon.forecasts.forecasting import Forecaster
    from gq.daemon.monitoring.monitor import Monitor
    from gq.daemon.mps import Mps
    from gq.daemon.options import DaemonOptions
    from gq.daemon.scheduling.admission import DeviceLoad
    from gq.daemon.scheduling.fair_share import Ledger
    from gq.daemon.serving.access import Rules
    from gq.daemon.serving.server import ConnectionLimits
    from gq.daemon.serving.waiting import Waiters
    from gq.exec.cgroups.job_cgroups import Usage
    from gq.exec.host.messages import DeviceMemory, PackingReport
    from gq.home import Home
    from gq.queue.engine import Database
    from gq.queue.models import Job


class NodeView(Protocol):
    """The daemon as request handlers see it."""

    home: Home
    db: Database
    rules: Rules
    options: DaemonOptions
    devices: list[Device]
    device_note: str | None
    started_at: float
    stopping: bool
    monitor: Monitor  # readings and the guard's holds, for 'gq info'
    waiters: Waiters  # the clients gq wait holds (what one user may wait for is bounded)
    forecaster: Forecaster  # the last forecast, and the gq submit --test-only waiting
    ledger: Ledger  # each user's fair-share usage
    mps: Mps  # the devices' MPS control daemons, for 'gq info'

    @property
    def connection_limits(self) -> ConnectionLimits: ...

    @property
    def containment(self) -> str:
        """How jobs' processes are kept: "cgroup v2", "cgroup v1" or "process groups", and
        where no cgroup holds their memory or their tasks, so."""

    @property
    def task_limits(self) -> tuple[int, int] | None:
        """The tasks one job, and all jobs together, may have at once (--max-pids, and the
        bound on the instance's base cgroup); None where no pids controller holds them."""

    def lane_memory(self, device: Device) -> int: ...

    def loads(self) -> list[DeviceLoad]: ...

    def sharing(self, device: str) -> PackingReport | None:
        """How the device's jobs share it under --lanes auto, as its host last said."""

    def usage(self, job: Job, processes_summed: int) -> Usage | None:
        """A running job's host-side memory and processes (its cgroup), where known
        (summing the memory of ``processes_summed`` processes at most)."""

    def device_memory(self, job_id: int) -> DeviceMemory | None:
        """Where a running job's device memory is, as its host last said (None: on the
        device, never moved, or the job runs not)."""

    def stale(self) -> str | None:
        """Why progress figures may be out of date."""

    def rescan(self) -> None:
        """Run the scheduling pass soon: the queue changed."""

    def signal_job(self, job_id: int, signum: int) -> bool:
        """Have a running job's host signal its main process group; False if it runs not."""

    def begin_stop(self, keep_jobs: bool) -> None: ...

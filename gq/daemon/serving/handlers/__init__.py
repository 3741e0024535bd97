"""What a client may ask the daemon: one module per request family, and this dispatcher.

Authorization that depends only on the request (operators alone change the node) is checked
here once, before dispatch; handlers check what depends on the job (its owner). Handlers see
the daemon only through :class:`NodeView`: the few things they read and the two they ask.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from gq import defaults, messages
from gq.daemon.forecasts.forecasting import WhatIf
from gq.daemon.serving.access import Caller, Rules, check_operator
from gq.daemon.serving.handlers import control, node, query, submit
from gq.daemon.serving.listings import Listing
from gq.daemon.serving.waiting import Waiters, Waiting
from gq.errors import UserError

if TYPE_CHECKING:
    from gq.daemon.devices import Device
    from gq.daemon.forecasts.forecasting import Forecaster
    from gq.daemon.monitoring.monitor import Monitor
    from gq.daemon.options import DaemonOptions
    from gq.daemon.scheduling.admission import DeviceLoad
    from gq.daemon.scheduling.fair_share import Ledger
    from gq.daemon.serving.server import ConnectionLimits
    from gq.exec.cgroups.job_cgroups import Usage
    from gq.exec.host.messages import DeviceMemory, PackingReport
    from gq.home import Home
    from gq.queue.engine import Database
    from gq.queue.models import Job

log = logging.getLogger("gq.daemon")


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


# handler(node, caller, request) -> answer, or (answer, descriptors to pass with it)
HANDLERS: dict[type, Callable[..., Any]] = {
    messages.Submit: submit.submit,
    messages.ListJobs: query.list_jobs,
    messages.ShowJob: query.show,
    messages.OpenLog: query.open_log,
    messages.ExportScript: query.export,
    messages.Wait: query.wait,
    messages.Suspend: control.suspend,
    messages.SignalJob: control.signal_job,
    messages.Drain: node.drain,
    messages.ResumeDevices: node.resume_devices,
    messages.Cancel: control.cancel,
    messages.Hold: control.hold,
    messages.Release: control.release,
    messages.Requeue: control.requeue,
    messages.Update: control.update,
    messages.SetPolicy: node.set_policy,
    messages.GetPolicy: node.get_policy,
    messages.NodeInfoRequest: node.info,
    messages.Stop: node.stop,
}
OPERATORS_ONLY: dict[type, str] = {
    messages.SetPolicy: "change the policy",
    messages.Stop: "stop the daemon",
    messages.Drain: "drain devices",
    messages.ResumeDevices: "resume devices",
    # A suspended job's time limit stops: a user could hold a device forever.
    messages.Suspend: "suspend or resume jobs",
}


def dispatch(
    daemon: NodeView, caller: Caller, line: bytes
) -> tuple[bytes, list[int]] | Waiting | WhatIf | Listing:
    """Decode one request line, authorize it, run its handler; always an answer line,
    whatever the line held and whatever the handler did, or a :class:`Waiting` (gq wait:
    the answer comes once the jobs have ended), a :class:`WhatIf` (gq submit --test-only:
    it comes with the next forecast) or a :class:`Listing` (a big listing: a child makes
    it)."""
    try:
        request = messages.decode(line, messages.REQUESTS)
    except messages.VersionMismatch as exc:
        return _error(
            f"this daemon speaks protocol version {defaults.PROTOCOL_VERSION} and "
            f"the client {str(exc.theirs)[:40]}: use the gq that matches the daemon, or "
            "restart it"
        ), []
    except messages.MessageError as exc:
        return _error(f"malformed request: {exc}"), []
    fds: list[int] = []
    try:
        if type(request) in OPERATORS_ONLY:
            check_operator(caller, OPERATORS_ONLY[type(request)])
        answer = HANDLERS[type(request)](daemon, caller, request)
        if isinstance(answer, (Waiting, WhatIf, Listing)):
            return answer
        answer, fds = answer if isinstance(answer, tuple) else (answer, [])
        return messages.encode(answer), fds
    except UserError as exc:
        _close(fds)
        return _error(str(exc), exc.exit_code), []
    except Exception:  # noqa: BLE001 - a request must not take the daemon down
        _close(fds)
        log.exception("request %s from %s failed", request.kind, caller.name)
        return _error(
            f"the daemon failed on this {request.kind} request; its log has the details", 1
        ), []


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _error(message: str, exit_code: int = 2) -> bytes:
    """An error answer: one printable line, whatever of the request it quotes."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    return messages.encode(messages.Error(line, exit_code))

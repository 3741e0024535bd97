"""The node: its policy (operators set it), what it has (anyone reads it), stopping it."""

from __future__ import annotations

import math
import os
import pwd
from typing import TYPE_CHECKING

from gq import defaults, messages, policies, validation
from gq.daemon import heap_trim
from gq.daemon.serving.access import Caller
from gq.daemon.serving.handlers.common import job_info
from gq.daemon.serving.handlers.query import fair_share
from gq.errors import UserError
from gq.queue import queries, settings
from gq.queue.states import JobState
from gq.units import format_seconds

if TYPE_CHECKING:
    from gq.daemon.serving.handlers.node_view import NodeView


def set_policy(daemon: NodeView, caller: Caller, request: messages.SetPolicy) -> messages.Done:
    """Hosts switch at their next iteration boundary (the daemon's next scan sends it)."""
    if request.name not in policies.NAMES:
        raise UserError(
            f"unknown policy {request.name!r}; choose one of {', '.join(policies.NAMES)}"
        )
    if request.fill not in policies.FILL_MODES:
        raise UserError(
            f"unknown --fill {request.fill!r}; choose one of {', '.join(policies.FILL_MODES)}"
        )
    try:
        policies.make(request.name, request.fill, request.quantum)
    except ValueError as exc:
        raise UserError(f"--quantum: {exc}") from None
    with daemon.db.write() as session:
        settings.put(session, settings.POLICY, request.name)
        settings.put(session, settings.FILL, request.fill)
        settings.put(session, settings.QUANTUM, request.quantum)
        if request.max_hold is not None:
            settings.put(session, settings.MAX_HOLD, request.max_hold)
    daemon.rescan()
    bound = (
        ""
        if request.max_hold is None
        else f", a hold others wait for bounded at {format_seconds(request.max_hold)}"
    )
    return messages.Done(
        f"Policy set to {policies.label(request.name, request.fill, request.quantum)}{bound}"
    )


def drain(daemon: NodeView, caller: Caller, request: messages.Drain) -> messages.Done:
    """No new job is admitted to the devices (or the node); running and resident jobs go on."""
    names = _device_names(daemon, request.devices)
    reason = validation.text(request.reason or "drained by an operator", "--reason", 200)
    if not reason.isprintable():
        raise UserError("--reason must be printable text on one line")
    with daemon.db.write() as session:
        drained = dict(settings.get(session, settings.DRAINED))
        drained.update({name: reason for name in names or [settings.NODE]})
        settings.put(session, settings.DRAINED, drained)
    daemon.rescan()
    return messages.Done(
        f"Draining {', '.join(names) or 'the node'} ({reason}): no new job "
        "starts there; running jobs go on"
    )


def resume_devices(
    daemon: NodeView, caller: Caller, request: messages.ResumeDevices
) -> messages.Done:
    names = _device_names(daemon, request.devices)
    with daemon.db.write() as session:
        drained = dict(settings.get(session, settings.DRAINED))
        for name in names or list(drained):
            drained.pop(name, None)
        settings.put(session, settings.DRAINED, drained)
    daemon.rescan()
    return messages.Done(f"Resumed {', '.join(names) or 'the node'}: jobs start there again")


def _device_names(daemon: NodeView, names: list[str]) -> list[str]:
    known = {d.name for d in daemon.devices}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UserError(
            f"no device {', '.join(n[:40] for n in unknown)} on this node (its "
            f"devices: {', '.join(sorted(known))})"
        )
    return list(dict.fromkeys(names))


def get_policy(
    daemon: NodeView, caller: Caller, request: messages.GetPolicy
) -> messages.PolicyInfo:
    with daemon.db.read() as session:
        return messages.PolicyInfo(
            settings.get(session, settings.POLICY),
            settings.get(session, settings.FILL),
            settings.get(session, settings.QUANTUM),
            settings.get(session, settings.MAX_HOLD),
            daemon.options.rotate,
        )


def info(daemon: NodeView, caller: Caller, request: messages.NodeInfoRequest) -> messages.NodeInfo:
    with daemon.db.read() as session:
        config = settings.get_all(session)
        running = [
            job_info(job, detail=False)
            for job in queries.jobs(session, states=[JobState.RUNNING], payloads=False)
        ]
    loads = {load.name: load for load in daemon.loads()}
    devices = []
    for d in daemon.devices:
        load = loads.get(d.name)
        jobs = [j for j in running if d.name in (j.device or "").split(",")]
        devices.append(
            messages.DeviceInfo(
                name=d.name,
                kind=d.kind,
                index=d.index,
                memory_total=d.memory_total,
                model=d.model,
                lane_memory=daemon.lane_memory(d),
                jobs=jobs,
                headroom=max(lane.headroom() for lane in load.lanes) if load else None,
                residents=load.residents if load else 0,
                free_at=None if load is None or load.free_at == math.inf else load.free_at,
                free_forecast=_forecast_free(daemon, jobs),
                sharing=_sharing(daemon.sharing(d.name)),
                uuid=d.uuid,
                reading=daemon.monitor.readings.get(d.name),
                held=daemon.monitor.guard.held.get(d.name),
            )
        )
    rules = daemon.rules
    return messages.NodeInfo(
        pid=os.getpid(),
        mode=daemon.home.mode,
        started=daemon.started_at,
        lanes=daemon.options.lanes,
        max_resident=daemon.options.max_resident,
        policy=config[settings.POLICY],
        fill=config[settings.FILL],
        quantum=config[settings.QUANTUM],
        note=daemon.device_note,
        devices=devices,
        operators=_operators(daemon),
        priority_cap=rules.priority_cap,
        options=_shown_options(daemon.options.to_argv(), caller),
        limits=_limits(daemon),
        drained=dict(config[settings.DRAINED]),
        max_hold=config[settings.MAX_HOLD],
        fair_share=fair_share(daemon),
        packing=daemon.options.packing,
        memory=messages.DaemonMemory(rss=heap_trim.resident(), sqlite=heap_trim.sqlite_bytes()),
        mps=daemon.mps.line,
    )


def _sharing(report) -> messages.LaneSharing | None:
    """A host's --lanes auto report, as clients read it."""
    if report is None:
        return None
    return messages.LaneSharing(
        mode=report.mode,
        lanes=[list(jobs) for jobs in report.lanes],
        most=report.most,
        gain=report.gain,
        last=report.last,
        retry_at=report.retry_at,
        slowest=report.slowest,
        kept=report.kept,
    )


def _forecast_free(daemon: NodeView, jobs: list[messages.JobInfo]) -> float | None:
    """When a device's jobs should all have ended, as the last forecast has it: the same
    ends gq status --start shows (None: one of them has none)."""
    ends = [daemon.forecaster.current.jobs.get(job.id) for job in jobs]
    if not jobs or any(found is None or found.end is None for found in ends):
        return None
    return max(found.end for found in ends if found is not None and found.end is not None)


def _shown_options(argv: list[str], caller: Caller) -> list[str]:
    """The daemon's options, but the --on-finish command only to operators (it may hold a
    webhook's token)."""
    if caller.operator or "--on-finish" not in argv:
        return argv
    shown = list(argv)
    shown[shown.index("--on-finish") + 1] = "(hidden)"
    return shown


def _finite(seconds: float) -> float | None:
    return None if math.isinf(seconds) else seconds


def _limits(daemon: NodeView) -> messages.NodeLimits:
    connections, tasks = daemon.connection_limits, daemon.task_limits
    return messages.NodeLimits(
        max_pending=daemon.options.max_pending,
        max_spool=daemon.options.max_spool,
        max_array=daemon.options.max_array,
        max_connections_per_user=connections.per_user,
        max_connections=connections.total,
        max_request=connections.request,
        retention=_finite(daemon.options.retention),
        max_script=defaults.MAX_SCRIPT,
        max_job_payload=defaults.MAX_JOB_PAYLOAD,
        containment=daemon.containment,
        max_pids=tasks[0] if tasks else None,
        node_pids=tasks[1] if tasks else None,
    )


def _operators(daemon: NodeView) -> list[str]:
    rules = daemon.rules
    if not daemon.home.system:
        return [pwd.getpwuid(rules.daemon_uid).pw_name]
    return ["root"] + ([f"group {rules.operator_group}"] if rules.operator_group else [])


def stop(daemon: NodeView, caller: Caller, request: messages.Stop) -> messages.Done:
    daemon.begin_stop(keep_jobs=request.keep_jobs)
    what = "leaving running jobs to their hosts" if request.keep_jobs else "ending running jobs"
    return messages.Done(f"gq daemon stopping (pid {os.getpid()}), {what}")

"""gq info: the node as gq sees it (like sinfo): devices, memory, lanes, resident jobs."""

from __future__ import annotations

import time

import typer

from gq import codec, messages
from gq.cli import render
from gq.cli.common import ask


def info(json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Devices (NVML, or the cpu device), memory, lanes, resident jobs, policy, daemon."""
    node = ask(messages.NodeInfoRequest())
    if json_out:
        data = codec.fields_of(node)
        del data["v"]
        data["started"] = render.iso(node.started)
        data["uptime"] = time.time() - node.started
        data["devices"] = [
            dict(
                codec.fields_of(d),
                jobs=[
                    {
                        "id": j.id,
                        "job_id": j.label,
                        "name": j.name,
                        "user": j.user,
                        "lane": j.lane,
                        "holds_lane": j.holds_lane,
                    }
                    for j in d.jobs
                ],
            )
            for d in node.devices
        ]
        typer.echo(render.dumps(data))
        return
    cap = "" if node.priority_cap is None else f"; users' priority cap {node.priority_cap}"
    typer.echo(
        f"daemon: {node.mode} mode, pid {node.pid}, up "
        f"{render.duration(time.time() - node.started)}, "
        + ("lanes auto (chosen by measurement)" if node.packing else f"{node.lanes} lane(s)")
        + f" per device, up to {node.max_resident} resident jobs per device"
        + _memory(node.memory)
    )
    typer.echo(f"operators: {', '.join(node.operators)}{cap}")
    from gq.policies import label
    from gq.units import format_seconds

    typer.echo(
        f"policy: {label(node.policy, node.fill, node.quantum)}; a hold others wait for "
        f"lasts at most {format_seconds(node.max_hold)}"
    )
    if node.fair_share is not None:
        typer.echo(render.printable(render.fair_share(node.fair_share)))
    if node.limits is not None:
        typer.echo(_limits(node.limits))
    if node.note:
        typer.echo(node.note)
    if node.mps is not None:
        typer.echo(render.printable(node.mps))
    if "*" in node.drained:
        typer.echo(
            render.printable(
                f"node: draining ({node.drained['*']}); no new job starts; 'gq resume' undoes it"
            )
        )
    for device in node.devices:
        free = _free(device)
        typer.echo(
            f"{device.name}: {device.model}, {render.size(device.memory_total)} memory "
            f"({render.size(device.lane_memory)} per lane), "
            f"{len(device.jobs)} resident job(s); placement: "
            f"{_headroom(device.headroom)}, free {free}"
        )
        if device.reading is not None:
            typer.echo(f"  now: {_figures(device.reading)}")
        if device.held:
            typer.echo(f"  guard: {device.held}; no new job starts here")
        if device.name in node.drained:
            typer.echo(
                render.printable(
                    f"  draining ({node.drained[device.name]}); no new job "
                    f"starts here; 'gq resume {device.name}' undoes it"
                )
            )
        on_lane = {}
        if device.sharing is not None:
            typer.echo(f"  lanes: {_sharing(device.sharing)}")
            on_lane = {job: i for i, jobs in enumerate(device.sharing.lanes) for job in jobs}
        for job in device.jobs:
            lane = (
                ("holds" if job.holds_lane else "waits for")
                if job.worker
                else "is a plain process in"
            )
            typer.echo(
                render.printable(
                    f"  job {job.label} ({job.name}, {job.user}) {lane} lane "
                    f"{on_lane.get(job.id, job.lane)}"
                )
            )


def _limits(limits: messages.NodeLimits) -> str:
    return (
        f"limits: {limits.max_pending} pending jobs per user, {limits.max_array} tasks "
        f"per array, {limits.max_connections_per_user} connections per user "
        f"({limits.max_connections} in all), requests up to "
        f"{render.size(limits.max_request)} (scripts {render.size(limits.max_script)}, "
        f"{render.size(limits.max_spool)} of them kept per user, "
        f"environment and arguments {render.size(limits.max_job_payload)}); finished "
        f"jobs kept {_kept(limits.retention)}; jobs kept in "
        f"{limits.containment}"
        + (
            ""
            if limits.max_pids is None
            else f", at most {limits.max_pids} tasks each ({limits.node_pids} all together)"
        )
    )


def _kept(retention: float | None) -> str:
    from gq.units import describe_period

    return "for ever" if retention is None else describe_period(retention)


def _figures(reading: messages.DeviceReading) -> str:
    """The sampled figures a device reports, in a line."""
    parts = []
    if reading.utilization is not None:
        parts.append(f"{reading.utilization:.0f}% busy")
    if reading.memory_used is not None:
        parts.append(
            f"{render.size(reading.memory_used)} used"
            + (
                f" ({render.size(reading.external_memory)} outside gq)"
                if reading.external_memory
                else ""
            )
        )
    if reading.temperature is not None:
        parts.append(f"{reading.temperature:.0f} C")
    if reading.power is not None:
        limit = f" of {reading.power_limit:.0f} W" if reading.power_limit is not None else ""
        parts.append(f"{reading.power:.0f} W{limit}")
    if reading.sm_clock is not None:
        parts.append(f"SM {reading.sm_clock} MHz")
    if reading.throttle:
        parts.append(f"throttled: {', '.join(reading.throttle)}")
    if reading.ecc_errors:
        parts.append(f"{reading.ecc_errors} uncorrected ECC errors")
    return ", ".join(parts) + f" ({reading.source})"


def _free(device: messages.DeviceInfo) -> str:
    """When its residents should have ended (the forecast gq status --start shows), and
    when they must have (their time limits)."""
    if not device.residents:
        return "now"
    latest = (
        "a job has no time limit"
        if device.free_at is None
        else f"{render.short_time(device.free_at)} at the latest (time limits)"
    )
    if device.free_forecast is None:
        return f"unknown ({latest})" if device.free_at is None else latest
    return f"~{render.short_time(device.free_forecast)} (forecast; {latest})"


def _headroom(headroom: int | None) -> str:
    """The most memory a lane has left for another job (a lane over its figures has none:
    its residents' measured peaks, say, passed what they declared)."""
    if headroom is not None and headroom < 0:
        return f"no headroom ({render.size(-headroom)} over)"
    return f"{render.size(headroom)} headroom"


_FOUND = {
    "changed": "jobs came or went: measuring them taking turns",
    "measured": "measured taking turns",
    "paid": "side by side paid",
    "failed": "side by side did not pay",
    "drifted": "a rate changed: measuring them taking turns again",
}


def _sharing(sharing: messages.LaneSharing) -> str:
    """How the jobs share the device (--lanes auto): which run at once, and why."""
    groups = " | ".join(",".join(str(job) for job in jobs) for jobs in sharing.lanes) or "none"
    gain = f", {sharing.gain:.2f}x the work of taking turns" if sharing.gain is not None else ""
    if sharing.slowest is not None and sharing.kept is not None:
        gain += f", job {sharing.slowest} at {sharing.kept:.2f}x its own"
    found = f" ({_FOUND.get(sharing.last or '', sharing.last)}{gain})" if sharing.last else ""
    retry = ""
    if sharing.retry_at is not None and sharing.mode == "turns":
        retry = f"; tried again in {max(0.0, sharing.retry_at - time.time()):.0f}s"
    words = {
        "turns": "taking turns on one lane",
        "trial": "trying lanes of their own",
        "packed": "on lanes of their own at once",
    }
    return (
        f"{words.get(sharing.mode, sharing.mode)} (up to {sharing.most}): jobs {groups}"
        f"{found}{retry}"
    )


def _memory(memory: messages.DaemonMemory | None) -> str:
    """The daemon's own memory, as the daemon line ends with it."""
    if memory is None:  # an older daemon
        return ""
    from gq.units import format_size

    sqlite = "" if memory.sqlite is None else f", SQLite {format_size(memory.sqlite)} of it"
    return f"; daemon memory {format_size(memory.rss)}{sqlite}"

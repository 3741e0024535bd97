"""gq info: the node as gq sees it (like sinfo): devices, memory, lanes, resident jobs."""

from __future__ import annotations

import time

import typer

from gq.cli import render
from gq.cli.common import database, the_home
from gq.queue import queries, settings
from gq.queue.states import JobState


def info(json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Devices (NVML, or the cpu device), memory, lanes, resident jobs, policy, daemon."""
    from gq.daemon.control import running_pid
    from gq.daemon.devices import Device, discover

    pid = running_pid(the_home())
    with database().read() as session:
        config = settings.get_all(session)
        running = queries.jobs(session, states=[JobState.RUNNING])
    published = config.get(settings.DAEMON) if pid is not None else None
    if published:
        devices = [Device(**d) for d in published["devices"]]
        note = published["note"]
    else:
        devices, note = discover()
    data = {
        "daemon": {"running": pid is not None, "pid": pid,
                   "started": render.iso(published["started"]) if published else None,
                   "uptime": time.time() - published["started"] if published else None,
                   "lanes": published["lanes"] if published else None,
                   "max_resident": published["max_resident"] if published else None},
        "policy": config[settings.POLICY], "fill": config[settings.FILL],
        "note": note,
        "devices": [dict(d.as_dict(), jobs=[{"id": j.id, "name": j.name, "lane": j.lane,
                                              "holds_lane": j.holds_lane}
                                             for j in running
                                             if d.name in (j.device or "").split(",")])
                    for d in devices],
    }
    if json_out:
        typer.echo(render.dumps(data))
        return
    daemon = data["daemon"]
    if daemon["running"]:
        typer.echo(f"daemon: running, pid {pid}, up {render.duration(daemon['uptime'])}, "
                   f"{daemon['lanes']} lane(s) per device, up to {daemon['max_resident']} "
                   "resident jobs per device")
    else:
        typer.echo("daemon: not running (start it with 'gq daemon start')")
    fill = f" (fill {data['fill']})" if data["policy"] == "priority" else ""
    typer.echo(f"policy: {data['policy']}{fill}")
    if note:
        typer.echo(note)
    for device in data["devices"]:
        typer.echo(f"{device['name']}: {device['model']}, "
                   f"{render.size(device['memory_total'])} memory, "
                   f"{len(device['jobs'])} resident job(s)")
        for job in device["jobs"]:
            lane = "holds" if job["holds_lane"] else "waits for"
            typer.echo(f"  job {job['id']} ({job['name']}) {lane} lane {job['lane']}")

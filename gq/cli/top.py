"""gq top: a live view of the node (like top): devices with their sampled figures, the
jobs resident on each lane and who holds it, and the pending queue."""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import typer

from gq import messages
from gq.cli import render
from gq.cli.common import ask
from gq.errors import UserError

BAR = 12


def top(
    delay: float = typer.Option(
        1.0, "-d", "--delay", metavar="SECONDS", help="Seconds between refreshes."
    ),
    iterations: Optional[int] = typer.Option(
        None, "-n", "--iterations", metavar="N", help="Refresh N times, then exit."
    ),
    batch: bool = typer.Option(
        False,
        "-b",
        "--batch",
        help="Print each refresh as plain text (for pipes and logs), not full-screen.",
    ),
) -> None:
    """Live view of devices (utilization, memory, temperature, power), resident jobs per
    lane and the pending queue, refreshed every second; q quits (like top).

    Full-screen on a terminal; with -b, or when output is not a terminal, each refresh is
    printed as plain text.
    """
    if delay < 0.1 or (iterations is not None and iterations < 1):
        raise UserError("-d must be at least 0.1 seconds and -n at least 1")
    from rich.console import Console

    console = Console()
    if batch or not console.is_terminal:
        for count in _counting(iterations):
            if count:
                time.sleep(delay)
            console.print(_view(*_fetch()))
        return
    from rich.live import Live

    with _keys() as pressed, Live(console=console, screen=True, auto_refresh=False) as live:
        for _ in _counting(iterations):
            live.update(_view(*_fetch()), refresh=True)
            if pressed(delay) in ("q", "Q"):
                return


def _counting(iterations: int | None) -> Iterator[int]:
    count = 0
    while iterations is None or count < iterations:
        yield count
        count += 1


@contextmanager
def _keys():
    """A function that waits up to its argument in seconds for a key press on a terminal
    stdin and returns it ("" if none); stdin is in cbreak mode meanwhile."""
    stdin = sys.stdin
    if not stdin.isatty():
        yield lambda timeout: (time.sleep(timeout), "")[1]
        return
    fd = stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def pressed(timeout: float) -> str:
        readable, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 1).decode(errors="replace") if readable else ""

    try:
        yield pressed
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _fetch() -> tuple[messages.NodeInfo, list[messages.JobInfo]]:
    node = ask(messages.NodeInfoRequest())
    pending = ask(messages.ListJobs(states=["PENDING"])).jobs
    return node, pending


def _view(node: messages.NodeInfo, pending: list[messages.JobInfo]):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from gq.policies import label

    running = sum(len(d.jobs) for d in node.devices)
    waiting = sum(job.array_task_count or 1 for job in pending)  # a folded array's tasks
    header = Text(
        f"gq top  {time.strftime('%H:%M:%S')}  policy {label(node.policy, node.fill, node.quantum)}"
        f"  {running} running, {waiting} pending  ({node.mode} daemon, pid "
        f"{node.pid})",
        style="bold",
    )
    devices = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("DEVICE", "UTIL", "MEMORY", "TEMP", "POWER", "JOBS", "NOTE"):
        devices.add_column(column)
    lanes = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("DEVICE", "LANE", "JOBID", "USER", "NAME", "LANE STATE", "STEPS"):
        lanes.add_column(column)
    for device in node.devices:
        reading = device.reading
        util = reading.utilization if reading else None
        used = reading.memory_used if reading else None
        total = (
            reading.memory_total if reading and reading.memory_total else None
        ) or device.memory_total
        power = reading.power if reading else None
        limit = reading.power_limit if reading else None
        _row(
            devices,
            device.name,
            _bar(util, 100, f"{util:.0f}%" if util is not None else "-"),
            _bar(
                used,
                total,
                f"{render.size(used)}/{render.size(total)}" if used is not None else "-",
            ),
            _bar(
                reading.temperature if reading else None,
                100,
                f"{reading.temperature:.0f} C"
                if reading and reading.temperature is not None
                else "-",
            ),
            _bar(power, limit, f"{power:.0f} W" if power is not None else "-"),
            str(len(device.jobs)),
            device.held
            or ", ".join(reading.throttle if reading else [])
            or (f"lanes: {device.sharing.mode}" if device.sharing else ""),
        )
        sharing = device.sharing.lanes if device.sharing else []
        on_lane = {job: i for i, jobs in enumerate(sharing) for job in jobs}
        for job in device.jobs:
            _row(
                lanes,
                device.name,
                str(on_lane.get(job.id, job.lane)),
                job.label,
                job.user,
                render.name_mark(job),
                render.lane_state(job),
                f"{job.steps_done}/{job.steps_total or '?'}",
            )
    queue = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("JOBID", "USER", "NAME", "PRIO", "GPUS", "WAIT", "REASON"):
        queue.add_column(column)
    now = time.time()
    for job in pending[:50]:
        _row(
            queue,
            job.label,
            job.user,
            job.name,
            str(job.priority),
            str(job.gpus),
            render.duration(now - job.submit_time),
            job.reason or "",
        )
    more = (
        Text(f"... and {len(pending) - 50} more lines of pending jobs")
        if len(pending) > 50
        else Text("")
    )
    return Group(
        header,
        Text(""),
        devices,
        Text(""),
        lanes,
        Text(""),
        queue,
        more,
        Text("q quits", style="dim"),
    )


def _row(table, *cells: str) -> None:
    """Cells as plain text: a job named [red] stays a name, not markup."""
    from rich.text import Text

    table.add_row(*(Text(render.printable(cell)) for cell in cells))


def _bar(value: float | None, total: float | None, text: str) -> str:
    if value is None or not total:
        return text
    filled = max(0, min(BAR, round(BAR * value / total)))
    return f"{'█' * filled}{'░' * (BAR - filled)} {text}"

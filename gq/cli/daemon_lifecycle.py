"""gq daemon stop, restart and status: the node daemon once it runs (``gq daemon start``
is :mod:`gq.cli.daemon`'s, which registers these on its app)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from gq import client, home, messages
from gq.errors import UserError

if TYPE_CHECKING:
    import psutil


def stop(
    keep_jobs: bool = typer.Option(
        False,
        "--keep-jobs",
        help="Leave running jobs running (their hosts keep them); a new daemon re-adopts them.",
    ),
    timeout: float = typer.Option(
        60.0, "--timeout", metavar="SECONDS", help="Seconds to wait for it to exit."
    ),
) -> None:
    """Stop the daemon (operators only). Running jobs are ended, and --requeue ones go back
    to the queue, unless --keep-jobs."""
    from gq.daemon.pidfiles import live_hosts, readable, running_pid

    target = home.locate()
    if not readable(target):  # a system daemon, asked by someone who may not test its lock
        _stop_by_asking(target, keep_jobs, timeout)
        return
    pid = running_pid(target)
    if pid is None:
        if keep_jobs or not live_hosts(target):
            typer.echo("gq daemon is not running")
            return
        # Execution hosts outlived the daemon with their jobs: a daemon adopts them first.
        client.start_daemon(target, []).close()
        pid = running_pid(target)
    process = _process(pid)
    typer.echo(client.ask(messages.Stop(keep_jobs=keep_jobs), target).message)
    _wait_gone(lambda: running_pid(target) is not None, process, pid, timeout)
    typer.echo(f"gq daemon stopped (pid {pid})")


def restart(
    timeout: float = typer.Option(
        60.0, "--timeout", metavar="SECONDS", help="Seconds to wait for the old daemon to exit."
    ),
) -> None:
    """Replace the daemon without touching running jobs (after an upgrade, say): it stops
    leaving its jobs to their hosts, and a new one, started with the same options,
    re-adopts them."""
    from gq.daemon.pidfiles import running_pid

    target = home.locate()
    if target.system and os.geteuid() != 0:
        raise UserError("only root restarts the system daemon (or 'systemctl restart gq')")
    options: list[str] = []
    pid = running_pid(target)
    if pid is not None:
        options = client.ask(messages.NodeInfoRequest(), target).options
        process = _process(pid)
        client.ask(messages.Stop(keep_jobs=True), target)
        _wait_gone(lambda: running_pid(target) is not None, process, pid, timeout)
    client.start_daemon(target, options).close()
    typer.echo(
        f"gq daemon restarted (pid {running_pid(target)}, was "
        f"{pid if pid is not None else 'not running'}); running jobs kept"
    )


def _stop_by_asking(target: home.Home, keep_jobs: bool, timeout: float) -> None:
    """Ask the daemon to stop (it refuses all but operators) and wait until it no longer
    answers and has exited."""
    pid = client.ask(messages.NodeInfoRequest(), target).pid
    process = _process(pid)
    typer.echo(client.ask(messages.Stop(keep_jobs=keep_jobs), target).message)
    _wait_gone(lambda: client.answers(target), process, pid, timeout)
    typer.echo(f"gq daemon stopped (pid {pid})")


def _process(pid: int | None) -> psutil.Process | None:
    """The daemon's process, taken before it is asked to stop (so that its pid, once
    another process's, is not mistaken for it); None where it is gone already."""
    import psutil

    try:
        return psutil.Process(pid) if pid is not None else None
    except psutil.Error:
        return None


def _wait_gone(
    holding: Callable[[], bool], process: psutil.Process | None, pid: int | None, timeout: float
) -> None:
    """Until the daemon has let go of what ``holding`` tests (its lock, or its socket) and
    its process has exited: it lets go before it has closed the queue and Python has
    finished, which takes a moment more."""
    deadline = time.monotonic() + timeout
    while holding() or _runs(process):
        if time.monotonic() > deadline:
            raise UserError(f"the daemon (pid {pid}) did not stop within {timeout:g} s", 1)
        time.sleep(0.02)


def _runs(process: psutil.Process | None) -> bool:
    import psutil

    try:  # a zombie has exited (its parent has not reaped it yet)
        return (
            process is not None
            and process.is_running()
            and process.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.NoSuchProcess:
        return False


def status() -> None:
    """Say whether the daemon runs; exit 0 if it does, 1 if not (like systemctl is-active)."""
    from gq.daemon.pidfiles import readable, running_pid

    target = home.locate()
    pid = running_pid(target)
    if pid is None and not readable(target):  # a system daemon's lock is root's: ask it
        try:
            pid = client.ask(messages.NodeInfoRequest(), target).pid
        except client.Unreachable:
            pid = None
    if pid is None:
        typer.echo(f"gq daemon is not running ({target.mode} mode, {target.root})")
        raise typer.Exit(1)
    typer.echo(f"gq daemon is running (pid {pid}, {target.mode} mode, {target.root})")

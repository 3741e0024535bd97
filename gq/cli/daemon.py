"""gq daemon: start, stop and check the node daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Optional

import typer

from gq.cli.common import the_home
from gq.errors import UserError
from gq.units import parse_size

app = typer.Typer(help="Start, stop or check the node daemon.", no_args_is_help=True)


def _daemon_argv(lanes: int, max_resident: int, kill_wait: float,
                 cpu_memory: int | None) -> list[str]:
    argv = [sys.executable, "-m", "gq.daemon", "--lanes", str(lanes),
            "--max-resident", str(max_resident), "--kill-wait", str(kill_wait)]
    return argv + (["--cpu-memory", str(cpu_memory)] if cpu_memory is not None else [])


@app.command()
def start(
    foreground: bool = typer.Option(False, "--foreground", help="Stay attached (for systemd)."),
    lanes: int = typer.Option(1, "--lanes", help="Lanes per device: iterations that run at once."),
    max_resident: int = typer.Option(4, "--max-resident", help="Jobs kept resident per device."),
    kill_wait: float = typer.Option(10.0, "--kill-wait", help="Seconds between SIGTERM and SIGKILL."),
    cpu_memory: Optional[str] = typer.Option(None, "--cpu-memory", help="Memory the cpu device offers jobs (e.g. 8G) [all RAM]."),
) -> None:
    """Start the node daemon (detached unless --foreground); logs go to GQ_HOME/daemon.log."""
    from gq.daemon.control import running_pid

    if lanes < 1 or max_resident < 1 or kill_wait < 0:
        raise UserError("--lanes and --max-resident must be at least 1, --kill-wait not negative")
    cpu_bytes = parse_size(cpu_memory) if cpu_memory is not None else None
    home = the_home()
    pid = running_pid(home)
    if pid is not None:
        typer.echo(f"gq daemon is already running (pid {pid})")
        return
    argv = _daemon_argv(lanes, max_resident, kill_wait, cpu_bytes)
    if foreground:
        os.execv(argv[0], argv)
    with open(home.daemon_log, "ab") as log:
        os.chmod(home.daemon_log, 0o600)
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise UserError(f"the daemon exited at start (code {process.returncode}); "
                            f"see {home.daemon_log}")
        if running_pid(home) == process.pid and home.daemon_socket.exists():
            typer.echo(f"gq daemon started (pid {process.pid}); log: {home.daemon_log}")
            return
        time.sleep(0.02)
    raise UserError(f"the daemon did not come up within 30 s; see {home.daemon_log}")


@app.command()
def stop(
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for it to exit."),
) -> None:
    """Stop the daemon. Running jobs are ended: --requeue ones go back to the queue."""
    from gq.daemon.control import running_pid

    home = the_home()
    pid = running_pid(home)
    if pid is None:
        typer.echo("gq daemon is not running")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if running_pid(home) is None:
            typer.echo(f"gq daemon stopped (pid {pid})")
            return
        time.sleep(0.05)
    raise UserError(f"the daemon (pid {pid}) did not stop within {timeout:g} s")


@app.command()
def status() -> None:
    """Say whether the daemon runs; exit 0 if it does, 1 if not (like systemctl is-active)."""
    from gq.daemon.control import running_pid

    pid = running_pid(the_home())
    if pid is None:
        typer.echo("gq daemon is not running")
        raise typer.Exit(1)
    typer.echo(f"gq daemon is running (pid {pid})")

"""gq policy: choose how resident jobs share a device."""

from __future__ import annotations

import typer

from gq import policies
from gq.cli.common import database, the_home
from gq.errors import UserError
from gq.queue import settings

app = typer.Typer(help="Show or set the scheduling policy (fifo, srtf, fair, priority).",
                  no_args_is_help=True)

DESCRIPTIONS = {
    "fifo": "earliest-submitted job runs until it ends; later ones wait",
    "srtf": "least estimated remaining time first (--steps), else least attained service",
    "fair": "equal device time per user, then per job",
    "priority": "highest --priority first; lower jobs fill its idle time (--fill)",
}


@app.command("set")
def set_policy(
    name: str = typer.Argument(..., metavar="POLICY", help="fifo, srtf, fair or priority."),
    fill: str = typer.Option("always", "--fill", help="priority only: always, gapfit or never."),
) -> None:
    """Set the policy; running hosts switch at the next iteration boundary."""
    if name not in policies.NAMES:
        raise UserError(f"unknown policy {name!r}; choose one of {', '.join(policies.NAMES)}")
    if fill not in policies.FILL_MODES:
        raise UserError(f"unknown --fill {fill!r}; choose one of {', '.join(policies.FILL_MODES)}")
    with database().write() as session:
        settings.put(session, settings.POLICY, name)
        settings.put(session, settings.FILL, fill)
    from gq.daemon.control import poke

    poke(the_home())
    suffix = f" (fill {fill})" if name == "priority" else ""
    typer.echo(f"Policy set to {name}{suffix}")


@app.command("show")
def show_policy() -> None:
    """Print the current policy."""
    with database().read() as session:
        name, fill = settings.get(session, settings.POLICY), settings.get(session, settings.FILL)
    suffix = f" (fill {fill})" if name == "priority" else ""
    typer.echo(f"{name}{suffix}: {DESCRIPTIONS[name]}")

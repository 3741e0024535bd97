"""gq policy: choose how resident jobs share a device."""

from __future__ import annotations

import typer

from gq import messages
from gq.cli.common import ask

app = typer.Typer(
    help="Show or set the scheduling policy (fifo, srtf, fair, priority, rr, deadline).",
    invoke_without_command=True,
)

DESCRIPTIONS = {
    "fifo": "earliest-submitted job runs until it ends; later ones wait",
    "srtf": "least estimated remaining time first (--steps), else least attained service",
    "fair": "equal device time per user, then per job",
    "priority": "highest --priority first; lower jobs fill its idle time (--fill)",
    "rr": "resident jobs take turns, a quantum of device time or iterations each (--quantum)",
    "deadline": "earliest --deadline first; jobs that can still make it before those that cannot",
}


@app.callback()
def policy(ctx: typer.Context) -> None:
    """Show or set the scheduling policy; bare 'gq policy' shows it."""
    if ctx.invoked_subcommand is None:
        show_policy()


@app.command("set")
def set_policy(
    name: str = typer.Argument(
        ..., metavar="POLICY", help="fifo, srtf, fair, priority, rr or deadline."
    ),
    fill: str = typer.Option("always", "--fill", help="priority only: always, gapfit or never."),
    quantum: str = typer.Option(
        "100ms", "--quantum", help="rr only: device time (100ms, 2s) or iterations (10it) per turn."
    ),
) -> None:
    """Set the node's policy (operators only); hosts switch at the next iteration boundary."""
    typer.echo(ask(messages.SetPolicy(name, fill, quantum)).message)


@app.command("show")
def show_policy() -> None:
    """Print the current policy."""
    from gq.policies import label

    answer = ask(messages.GetPolicy())
    typer.echo(
        f"{label(answer.name, answer.fill, answer.quantum)}: {DESCRIPTIONS.get(answer.name, '')}"
    )

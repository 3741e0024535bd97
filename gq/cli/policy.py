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
    max_hold: str | None = typer.Option(
        None,
        "--max-hold",
        help="How long a job may go on holding its device while another job waits that the "
        "policy would run (500ms, 2s; default 2s): past it the job is frozen inside its "
        "iteration and the device goes on. Omitted: as it is.",
    ),
) -> None:
    """Set the node's policy (operators only); hosts switch at the next iteration boundary."""
    from gq.units import parse_hold

    hold = None if max_hold is None else parse_hold(max_hold)
    typer.echo(ask(messages.SetPolicy(name, fill, quantum, max_hold=hold)).message)


@app.command("show")
def show_policy() -> None:
    """Print the current policy."""
    from gq.policies import label
    from gq.units import format_seconds

    answer = ask(messages.GetPolicy())
    typer.echo(
        f"{label(answer.name, answer.fill, answer.quantum)}: {DESCRIPTIONS.get(answer.name, '')}"
        f"; a hold others wait for lasts at most {format_seconds(answer.max_hold)}"
        + _rotation(answer.name, answer.rotate)
    )


def _rotation(policy: str, period: float | None) -> str:
    """What the daemon's --rotate does under the policy, if it was given."""
    from gq.units import describe_period

    if period is None:
        return ""
    if policy in ("fair", "rr"):
        return (
            f"; residents take turns of {describe_period(period)} when more jobs want to be "
            "resident than fit (--rotate)"
        )
    return (
        f"; --rotate {describe_period(period)} is idle under {policy} (it acts under fair and rr)"
    )

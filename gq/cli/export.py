"""gq export slurm: jobs as sbatch scripts, so they move to a cluster unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gq import defaults, messages
from gq.cli.common import ask, labels
from gq.errors import UserError
from gq.slurm import export

app = typer.Typer(help="Write jobs out for another scheduler.", no_args_is_help=True)


@app.command("slurm")
def slurm(
    job_ids: list[str] = typer.Argument(
        ..., metavar="JOBID...", help="Job ids (17, a whole array, or 17_3)."
    ),
) -> None:
    """Print an sbatch script for the job (gq export slurm 17 | sbatch): its options as
    #SBATCH lines, its interpreter, script and directory where they still are (else its
    snapshot inlined). Several jobs, or one with dependencies, give one bash script that
    submits them in order and chains their Slurm ids. What Slurm cannot carry is said on
    stderr, one line each."""
    items = [_exported(label) for label in labels(job_ids)]
    if len(items) == 1 and not items[0].job.dependency:
        text, notes = export.sbatch_script(items[0])
    else:
        text, notes = export.submitter(items)
    for note in notes:
        typer.echo(f"gq: note: {note}", err=True)
    typer.echo(text, nl=False)


def _exported(label: str) -> export.Exported:
    """Ask for the job, and look (with the caller's own rights) whether its script and
    interpreter are still where it ran them."""
    answer = ask(messages.ExportScript(label))
    job = answer.job
    try:
        body = answer.body.decode()
    except UnicodeDecodeError:
        raise UserError(f"job {job.label}'s script is not UTF-8 text; cannot export it") from None
    return export.Exported(
        job=job,
        body=body,
        array_tasks=answer.array_tasks,
        script_unchanged=_same_file(job.script, answer.body),
        interpreter_exists=bool(job.interpreter) and os.access(job.interpreter, os.X_OK),
    )


def _same_file(path: str | None, snapshot: bytes) -> bool:
    if not path:
        return False
    try:
        with Path(path).open("rb") as handle:
            return handle.read(defaults.MAX_SCRIPT + 1) == snapshot
    except OSError:
        return False

"""gq export slurm: an sbatch script for a gq job, so it moves to a cluster unchanged."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from gq.cli.common import database, resolve_one
from gq.errors import UserError
from gq.queue.models import Job
from gq.units import format_duration

app = typer.Typer(help="Write a job out for another scheduler.", no_args_is_help=True)
_END = "GQ_SCRIPT_EOF"


@app.command("slurm")
def slurm(job_id: str = typer.Argument(..., metavar="JOBID", help="The job id (17 or 17_3).")) -> None:
    """Print an sbatch script for the job: options as #SBATCH lines, the snapshot inlined."""
    with database().read() as session:
        job = resolve_one(session, job_id)
    try:
        body = Path(job.spool_path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the snapshot of job {job.label}: {exc}") from None
    if _END in body:
        raise UserError(f"job {job.label}'s script contains the line {_END}; cannot inline it")
    typer.echo(render(job, body), nl=False)


def _sbatch_lines(job: Job) -> list[str]:
    lines = [f"--job-name={job.name}"]
    if job.gpus:
        lines.append(f"--gres=gpu:{job.gpus}")
    if job.mem:
        lines.append(f"--mem={max(1, job.mem >> 20)}M")
    if job.time_limit:
        lines.append(f"--time={format_duration(job.time_limit)}")  # sbatch reads M:SS too
    lines += [f"--output={_pattern(job, job.stdout_path)}",
              f"--error={_pattern(job, job.stderr_path)}", f"--chdir={job.workdir}"]
    if job.requeue:
        lines.append("--requeue")
    if job.exclusive:
        lines.append("--exclusive")
    if job.priority:
        lines.append(f"--nice={-job.priority}")
    return lines


def _pattern(job: Job, path: str) -> str:
    """Turn this job's resolved output file name back into a pattern for the cluster's ids."""
    resolved = Path(path)
    name = resolved.name.replace(str(job.id), "%j", 1) if str(job.id) in resolved.name else \
        resolved.name
    return str(resolved.with_name(name))


def render(job: Job, body: str) -> str:
    suffix = Path(job.script).suffix
    run = (f'python3 "$script"' if job.interpreter else
           '"$script"' if body.startswith("#!") else 'bash "$script"')
    args = " ".join(shlex.quote(a) for a in job.args)
    header = ["#!/bin/bash", f"# Exported from gq job {job.label} ({job.script})"]
    header += [f"#SBATCH {line}" for line in _sbatch_lines(job)]
    return "\n".join(header + [
        "",
        f'script="${{TMPDIR:-/tmp}}/gq-export-{job.label}-${{SLURM_JOB_ID:-$$}}{suffix}"',
        f"cat > \"$script\" <<'{_END}'",
        body.rstrip("\n"),
        _END,
        'chmod +x "$script"',
        f"export GQ_JOB_NAME={shlex.quote(job.name)}",
        f"{run} {args}".rstrip(),
        "status=$?",
        'rm -f "$script"',
        "exit $status",
        "",
    ])

"""gq export slurm: an sbatch script for a gq job, so it moves to a cluster unchanged."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from gq import messages
from gq.cli.common import ask, labels
from gq.errors import UserError
from gq.messages import JobInfo
from gq.units import format_duration

app = typer.Typer(help="Write a job out for another scheduler.", no_args_is_help=True)
_END = "GQ_SCRIPT_EOF"


@app.command("slurm")
def slurm(job_id: str = typer.Argument(..., metavar="JOBID", help="The job id (17 or 17_3).")) -> None:
    """Print an sbatch script for the job: options as #SBATCH lines, the snapshot inlined."""
    answer = ask(messages.ExportScript(labels([job_id])[0]))
    job = answer.job
    try:
        body = answer.body.decode()
    except UnicodeDecodeError:
        raise UserError(f"job {job.label}'s script is not UTF-8 text; cannot inline it") from None
    if _END in body:
        raise UserError(f"job {job.label}'s script contains the line {_END}; cannot inline it")
    typer.echo(render(job, body), nl=False)


def _sbatch_lines(job: JobInfo) -> list[str]:
    lines = [f"--job-name={job.name}"]
    if job.gpus:
        lines.append(f"--gres=gpu:{job.gpus}")
    if job.mem:
        lines.append(f"--mem={max(1, job.mem >> 20)}M")
    if job.time_limit:
        lines.append(f"--time={format_duration(job.time_limit)}")  # sbatch reads M:SS too
    lines += [f"--output={_pattern(job, job.stdout)}",
              f"--error={_pattern(job, job.stderr)}", f"--chdir={job.workdir}"]
    if job.requeue:
        lines.append("--requeue")
    if job.exclusive:
        lines.append("--exclusive")
    if job.priority < 0:  # a positive nice lowers a job's priority, which any user may do
        lines.append(f"--nice={-job.priority}")
    return lines


def _pattern(job: JobInfo, path: str) -> str:
    """Turn this job's resolved output file name back into a pattern for the cluster's ids."""
    resolved = Path(path)
    name = resolved.name.replace(str(job.id), "%j", 1) if str(job.id) in resolved.name else \
        resolved.name
    return str(resolved.with_name(name))


def render(job: JobInfo, body: str) -> str:
    suffix = Path(job.script).suffix
    run = ('python3 "$script"' if job.script.endswith(".py") else
           '"$script"' if body.startswith("#!") else 'bash "$script"')
    args = " ".join(shlex.quote(a) for a in job.args)
    header = ["#!/bin/bash", f"# Exported from gq job {job.label} ({job.script})"]
    header += [f"#SBATCH {line}" for line in _sbatch_lines(job)]
    if job.priority > 0:  # --nice=-N and --priority are for Slurm administrators only
        header.append(f"# gq priority {job.priority}: sbatch lets only administrators raise "
                      "a job's priority")
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

"""gq jobs as sbatch scripts (pure): the options through the map of
:mod:`gq.slurm.options`, the command as the job ran it (its interpreter, its script where it
still is, in its directory), and dependencies between jobs exported together as one script
that submits them in order, chaining the ids Slurm gives them.

Every function returns the text and the notes: one line for each thing that cannot be
carried to Slurm as gq meant it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath

from gq import defaults
from gq.errors import UserError
from gq.messages import JobInfo
from gq.queue import arrays, dependencies
from gq.slurm.options import GPU_TYPE, sbatch_name
from gq.units import format_duration, format_size

END = "GQ_SCRIPT_EOF"


@dataclass(frozen=True)
class Exported:
    """One job to write out, with what the client found on this machine."""

    job: JobInfo
    body: str  # its snapshot
    array_tasks: list[int] | None = None  # a whole array: every task id
    script_unchanged: bool = False  # its submitted script is still there, as snapshotted
    interpreter_exists: bool = False  # the interpreter it ran with is still there


def sbatch_script(item: Exported) -> tuple[str, list[str]]:
    """A script that ``sbatch`` runs as gq ran the job (its dependency aside: see
    :func:`submitter`)."""
    job = item.job
    notes: list[str] = []
    lines = ["#!/bin/bash", f"# Exported from gq job {job.label} ({_printable(job.script)})"]
    lines += [f"#SBATCH {option}" for option in _options(item, notes)]
    lines += _comments(job, notes)
    lines += [""] + _command(item, notes)
    return "\n".join(lines) + "\n", notes


def submitter(items: list[Exported]) -> tuple[str, list[str]]:
    """A bash script that submits several jobs with sbatch in id order, each dependency
    rewritten to the Slurm ids of the jobs exported with it."""
    items = sorted(items, key=lambda item: item.job.id)
    exported = {item.job.id for item in items} | {
        item.job.array_job_id for item in items if item.job.array_job_id is not None
    }
    notes: list[str] = []
    out = [
        "#!/bin/bash",
        f"# Exported from gq jobs {', '.join(i.job.label for i in items)}: run it with "
        "bash where sbatch is; it submits them in order.",
        "set -euo pipefail",
    ]
    names = []
    for item in items:
        job = item.job
        variable = f"job_{job.label}"
        names.append(f"${variable}")
        text, more = sbatch_script(item)
        notes += more
        depend = ""
        if job.dependency:
            depend = f' "--dependency={_chained(job, exported)}"'
        marker = f"GQ_JOB_{job.label}_EOF"
        if marker in text.splitlines():
            raise UserError(
                f"job {job.label}'s script contains the line {marker}; cannot inline it"
            )
        out += [
            f"{variable}=$(sbatch --parsable{depend} <<'{marker}'",
            text.rstrip("\n"),
            marker,
            ")",
            f"{variable}=${{{variable}%%;*}}  # ID;CLUSTER on federations",
        ]
    out.append(
        f'echo "gq jobs {" ".join(i.job.label for i in items)} are Slurm jobs {" ".join(names)}"'
    )
    return "\n".join(out) + "\n", notes


def _chained(job: JobInfo, exported: set[int]) -> str:
    """The job's dependency with each gq id as the shell variable of its Slurm id."""
    missing = sorted(set(dependencies.parse(job.dependency or "").job_ids) - exported)
    if missing:
        raise UserError(
            f"job {job.label} depends on job(s) {', '.join(map(str, missing))}, "
            "which are not exported with it; add them to the command"
        )
    text = re.sub(r"\s", "", job.dependency or "")  # blanks the parser let pass
    if not re.fullmatch(r"[a-z]+(?::\d+)+(?:[,?][a-z]+(?::\d+)+)*", text):
        raise UserError(
            f"job {job.label}'s dependency {text[:60]!r} cannot be written for sbatch; not exported"
        )
    return re.sub(r"(?<=:)(\d+)", lambda m: f"${{job_{m.group(1)}}}", text)


def _options(item: Exported, notes: list[str]) -> list[str]:
    job = item.job
    options = [_pair("--job-name", job.name)]
    if item.array_tasks:
        spec = arrays.fold(item.array_tasks, job.array_max_running).strip("[]")
        options.append(f"--array={spec}")
    elif job.array_task_id is not None:
        options.append(f"--array={job.array_task_id}")  # one task, as its own array
    if job.gpus:
        kind = f"{job.gpu_type}:" if job.gpu_type and GPU_TYPE.fullmatch(job.gpu_type) else ""
        options.append(f"--gres=gpu:{kind}{job.gpus}")
    if job.host_mem:
        options.append(f"{sbatch_name('--host-mem')}={max(1, job.host_mem >> 20)}M")
    if job.cpus:
        options.append(f"{sbatch_name('--cpus-per-task')}={job.cpus}")
    if job.ntasks:
        options.append(f"{sbatch_name('--ntasks')}={job.ntasks}")
    if job.nodelist:
        notes.append(f"job {job.label}: -w {job.nodelist} names gq devices; not carried")
    if job.time_limit:
        options.append(f"--time={format_duration(job.time_limit)}")  # sbatch reads M:SS too
    if job.begin_time:
        options.append(f"--begin={_iso(job.begin_time)}")
    if job.warn_signal:
        options.append(f"--signal={job.warn_signal}")
    if job.deadline:
        options.append(f"--deadline={_iso(job.deadline)}")
    output = job.output_pattern or _pattern(job, job.stdout or "")
    error = job.error_pattern or _pattern(job, job.stderr or "")
    # gq's default is left out: on Slurm its files would meet gq's of the same number
    if output != defaults.OUTPUT:
        options.append(_pair("--output", output))
    if error != output:
        options.append(_pair("--error", error))
    options.append(_pair("--chdir", job.workdir or "."))
    if job.requeue:
        options.append("--requeue")
    if job.held:
        options.append("--hold")
    if job.priority < 0:  # a positive nice lowers a job's priority, which any user may do
        options.append(f"--nice={-job.priority}")
    return options


def _comments(job: JobInfo, notes: list[str]) -> list[str]:
    """What Slurm has no option for, said in the script and on stderr."""
    said = []
    if job.mem:
        said.append(
            f"gq --gpu-mem {format_size(job.mem)}: device memory; a Slurm GPU is "
            "the job's alone, whatever it needs"
        )
    if job.exclusive and job.gpus <= 1:
        said.append("gq --exclusive: a whole device, as every Slurm GPU is")
    if job.steps_total:
        said.append(f"gq --steps {job.steps_total}: Slurm does not use it")
    if job.priority > 0:
        said.append(
            f"gq --priority {job.priority}: sbatch lets only administrators raise a job's priority"
        )
        notes.append(
            f"job {job.label}: --priority {job.priority} is not carried (only Slurm "
            "administrators raise priorities)"
        )
    return [f"# {text}" for text in said]


def _command(item: Exported, notes: list[str]) -> list[str]:
    """The lines that run the job: its script where it is, unchanged, else its snapshot
    inlined; a Python job with the interpreter it ran with."""
    job = item.job
    script = job.script or "script"
    args = " ".join(shlex.quote(a) for a in job.args or [])
    python = job.script.endswith(".py") if job.script else False
    lines = ['export GQ_JOB_ID="$SLURM_JOB_ID" GQ_JOB_NAME="$SLURM_JOB_NAME"']
    if job.array_job_id is not None:
        lines.append(
            'export GQ_ARRAY_JOB_ID="$SLURM_ARRAY_JOB_ID" GQ_ARRAY_TASK_ID="$SLURM_ARRAY_TASK_ID"'
        )
    interpreter = "python3"
    if python and job.interpreter:
        if item.interpreter_exists:
            interpreter = shlex.quote(job.interpreter)
        else:
            notes.append(
                f"job {job.label}: its interpreter {job.interpreter} is gone; "
                "the script runs with python3 from PATH"
            )
    if item.script_unchanged:
        return lines + [
            f"exec {_runner(item.body, interpreter if python else None)}"
            f"{shlex.quote(script)} {args}".rstrip()
        ]
    notes.append(
        f"job {job.label}: {script} is gone or changed since it was submitted; its "
        "snapshot is inlined"
    )
    if END in item.body.splitlines():
        raise UserError(f"job {job.label}'s script contains the line {END}; cannot inline it")
    suffix = re.sub(r"[^A-Za-z0-9._-]", "", PurePosixPath(script).suffix)
    copy = f'"${{TMPDIR:-/tmp}}/gq-export-{job.label}-$SLURM_JOB_ID{suffix}"'
    run = (
        f'{interpreter} "$script"'
        if python
        else '"$script"'
        if item.body.startswith("#!")
        else 'bash "$script"'
    )
    if python:  # its sibling modules, where they still are
        directory = shlex.quote(str(PurePosixPath(script).parent))
        lines.append(f'export PYTHONPATH={directory}"${{PYTHONPATH:+:$PYTHONPATH}}"')
    return lines + [
        f"script={copy}",
        f"cat > \"$script\" <<'{END}'",
        item.body.rstrip("\n"),
        END,
        'chmod +x "$script"',
        f"{run} {args}".rstrip(),
        "status=$?",
        'rm -f "$script"',
        "exit $status",
    ]


def _runner(body: str, interpreter: str | None) -> str:
    """What runs the script in place: the interpreter a Python job ran with, else its
    ``#!`` line as the kernel reads it (the file need not be executable), else bash."""
    if interpreter is not None:
        return f"{interpreter} "
    if body.startswith("#!"):
        program, _, option = body[2:].split("\n", 1)[0].strip().partition(" ")
        return " ".join(shlex.quote(p) for p in (program, option.strip()) if p) + " "
    return "bash "


def _printable(text: str | None) -> str:
    """Text for a comment line: a newline in a path must not end the comment."""
    return "".join(c if c.isprintable() else "?" for c in text or "")


def _pair(option: str, value: str) -> str:
    """``--option=value``, in double quotes where sbatch's directive reader needs them
    (blanks, quotes, backslashes, #). A value no #SBATCH line can hold (a newline in a
    directory's name) is refused: the rest of it would run as a command on the cluster."""
    if not value.isprintable():
        raise UserError(
            f"{option} {value[:60]!r} holds a newline or another control "
            "character, which no #SBATCH line can carry; not exported"
        )
    if re.fullmatch(r"[\w@%+=:,./-]+", value):
        return f"{option}={value}"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{option}="{escaped}"'


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%dT%H:%M:%S")


def _pattern(job: JobInfo, path: str) -> str:
    """An output pattern rebuilt from a resolved path (jobs from before patterns were
    kept): the job id where it stands alone as a number, as %j (%A_%a for a task)."""
    resolved = PurePosixPath(path)
    task = rf"{job.array_job_id}_{job.array_task_id}" if job.array_job_id is not None else None
    name = resolved.name
    if task is not None and re.search(rf"(?<!\d){task}(?!\d)", name):
        name = re.sub(rf"(?<!\d){task}(?!\d)", "%A_%a", name, count=1)
    else:
        name = re.sub(rf"(?<!\d){job.id}(?!\d)", "%j", name, count=1)
    if job.workdir and str(resolved.parent) == job.workdir:
        return name
    return str(resolved.with_name(name))

"""gq submit and gq run as typer commands: their options and help. What they do is
gq/cli/submission.py's (which gq/cli/quick.py calls for plain lines, without typer)."""

from __future__ import annotations

import functools
from typing import Any, Optional

import typer

from gq import defaults
from gq.cli import submission
from gq.cli.common import usage_message
from gq.errors import UserError

SUBMIT_HELP = """Queue SCRIPT to run with ARGS on the node's devices (like sbatch).

Prints "Submitted job ID". Options may also be written in the script's first comment
block as '#GQ --gpu-mem 6G' lines, or as '#SBATCH' lines as for sbatch (there --mem is host
memory, as on a cluster); the command line wins, then #GQ, then #SBATCH. The script is
copied into the queue now, so later edits do not change this job. .py scripts run with this
Python (or --python) and are swapped at iteration boundaries; other scripts run via their
shebang or bash. Jobs see sbatch's SLURM_* variables, and srun runs its command in the job.

Example: gq submit -G 1 --gpu-mem 6G -t 2:00:00 --steps 5000 train.py --lr 3e-4
"""
RUN_HELP = """Queue a command line, with gq submit's options (like ts, pueue add).

gq run [OPTIONS] -- COMMAND [ARGS]...  A Python command (python train.py ..., python -m
pkg ...) runs as a Python job, with iteration boundaries, by the python your PATH finds
now; any other command runs as it is, from sh. Prints "Submitted job ID".

With --pty the command runs on this terminal, as srun --pty runs it: gq waits while
the job is pending, then is its terminal until it ends, and exits with its exit status.

Examples: gq run -G 1 -t 1:00:00 -- python train.py --lr 3e-4;
gq run --pty -G 1 -- python
"""


def submit(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(
        None, metavar="SCRIPT", help="The script to run (snapshotted at submit)."
    ),
    args: Optional[list[str]] = typer.Argument(
        None, metavar="ARGS", help="Arguments passed to the script."
    ),
    wrap: Optional[str] = typer.Option(
        None,
        "--wrap",
        metavar="CMD",
        help="Run this command line instead of a script (as sbatch); a Python one gets iteration boundaries.",
    ),
    job_name: Optional[str] = typer.Option(
        None, "-J", "--job-name", help="Job name [script name]."
    ),
    gpus: Optional[str] = typer.Option(
        None,
        "-G",
        "--gpus",
        metavar="[TYPE:]N",
        help="Devices: 0 = CPU only, 1 = one shared device [default], N = N whole devices; TYPE (a100) must match the device model.",
    ),
    gpus_per_node: Optional[str] = typer.Option(
        None, "--gpus-per-node", metavar="[TYPE:]N", help="As --gpus (sbatch's spelling; one node)."
    ),
    gres: Optional[str] = typer.Option(
        None, "--gres", metavar="gpu[:TYPE][:N]", help="As --gpus (sbatch's spelling)."
    ),
    gpu_mem: Optional[str] = typer.Option(
        None, "--gpu-mem", metavar="SIZE", help="Device memory the job needs: 512M, 6G, ..."
    ),
    mem: Optional[str] = typer.Option(
        None,
        "--mem",
        metavar="SIZE",
        help="Deprecated: device memory, as --gpu-mem (in #SBATCH lines --mem is host memory, as --host-mem).",
    ),
    host_mem: Optional[str] = typer.Option(
        None,
        "--host-mem",
        metavar="SIZE",
        help="Host memory (RAM) for the job, its cgroup's limit; 0 = no limit (#SBATCH --mem).",
    ),
    mem_per_cpu: Optional[str] = typer.Option(
        None, "--mem-per-cpu", metavar="SIZE", help="Host memory per CPU (times --cpus-per-task)."
    ),
    mem_per_gpu: Optional[str] = typer.Option(
        None, "--mem-per-gpu", metavar="SIZE", help="Host memory per device (times --gpus)."
    ),
    cpus_per_task: Optional[int] = typer.Option(
        None, "-c", "--cpus-per-task", metavar="N", help="CPUs the job uses (SLURM_CPUS_PER_TASK)."
    ),
    ntasks: Optional[int] = typer.Option(
        None,
        "-n",
        "--ntasks",
        metavar="N",
        help="Tasks: SLURM_NTASKS, the copies 'srun CMD' starts in the job [1].",
    ),
    nodelist: Optional[str] = typer.Option(
        None,
        "-w",
        "--nodelist",
        metavar="DEVICES",
        help="Run only on these devices: gpu0,gpu2 (see 'gq info').",
    ),
    time_limit: Optional[str] = typer.Option(
        None, "-t", "--time", help="Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED."
    ),
    warn_signal: Optional[str] = typer.Option(
        None,
        "--signal",
        metavar="[B:]SIG[@SECONDS]",
        help="Send SIG that long (60) before the time limit: B: to the job's main process, else to the tasks srun started or, without any, the main process (as sbatch).",
    ),
    begin: Optional[str] = typer.Option(
        None,
        "--begin",
        metavar="TIME",
        help="Start no earlier (REASON BeginTime): now+1hour, 16:00, tomorrow, YYYY-MM-DD[THH:MM].",
    ),
    deadline: Optional[str] = typer.Option(
        None,
        "--deadline",
        help="End by then or be removed (state DEADLINE): YYYY-MM-DD[THH:MM[:SS]], HH:MM, now+2hours, ...",
    ),
    priority: int = typer.Option(
        0, "--priority", help="Higher runs first under the priority policy."
    ),
    steps: Optional[int] = typer.Option(
        None, "--steps", help="Total iterations (lets srtf estimate remaining time)."
    ),
    output: str = typer.Option(
        defaults.OUTPUT,
        "-o",
        "--output",
        help="stdout file; %j job id, %x name, %u user, %N node, %A array id, %a task.",
    ),
    error: Optional[str] = typer.Option(
        None, "-e", "--error", help="stderr file [same as --output]."
    ),
    chdir: Optional[str] = typer.Option(
        None, "-D", "--chdir", help="Working directory [the current one]."
    ),
    exclusive: bool = typer.Option(
        False, "--exclusive", help="Take the whole device; share it with no job."
    ),
    requeue: bool = typer.Option(
        False, "--requeue", help="Requeue instead of failing if the node fails."
    ),
    retries: Optional[int] = typer.Option(
        None,
        "--retries",
        metavar="N",
        help="Run a failed job (non-zero exit; not a cancel or a timeout) again, up to N times.",
    ),
    oom: str = typer.Option(
        defaults.ON_OOM,
        "--oom",
        metavar="requeue|fail",
        help="If it runs out of memory: back to the queue, its --gpu-mem raised to what it asked for (REASON OutOfMemory; at most --retries times, else 3) [requeue], or FAILED.",
    ),
    retry_delay: Optional[str] = typer.Option(
        None,
        "--retry-delay",
        metavar="PERIOD",
        help="Wait this long before each retry: 30s, 5min [0].",
    ),
    python: Optional[str] = typer.Option(
        None, "--python", help="Interpreter for .py scripts [this one]."
    ),
    array: Optional[str] = typer.Option(
        None, "-a", "--array", help="Job array: 0-99%8, 1,3,5, 0-20:5 (%N: at most N at once)."
    ),
    dependency: Optional[str] = typer.Option(
        None,
        "-d",
        "--dependency",
        help="afterok|afterany|afternotok|after:ID[:ID] joined by , (all) or ? (any).",
    ),
    after: Optional[str] = typer.Option(None, "--after", help="Short for --dependency afterok:ID."),
    hold: bool = typer.Option(False, "-H", "--hold", help="Queue held; 'gq release' lets it run."),
    notify: Optional[str] = typer.Option(
        None,
        "--notify",
        metavar="CMD",
        help="Run CMD (sh) as you once the job has ended, with GQ_JOB_ID, GQ_JOB_STATE, GQ_JOB_EXIT_CODE, ... set.",
    ),
    mail_type: Optional[str] = typer.Option(
        None,
        "--mail-type",
        metavar="TYPES",
        help="Mail at BEGIN, END, FAIL, REQUEUE or ALL (comma-separated), through this node's mail.",
    ),
    mail_user: Optional[str] = typer.Option(
        None, "--mail-user", metavar="ADDRESS", help="Whom --mail-type mails [you]."
    ),
    parsable: bool = typer.Option(False, "--parsable", help="Print only the job id."),
    wait: bool = typer.Option(
        False,
        "-W",
        "--wait",
        help="Then wait until it has ended and exit with its exit code (as sbatch --wait).",
    ),
    test_only: bool = typer.Option(
        False,
        "--test-only",
        help="Queue nothing: check the job, say when and where it would start and end, and which queued jobs it would delay (as sbatch --test-only).",
    ),
    idle_timeout: Optional[str] = typer.Option(
        None,
        "--idle-timeout",
        metavar="TIME",
        help="An interactive job (--pty, gq kernel install) idle this long (as -t: M, M:S, H:M:S, ...) is ended (state TIMEOUT), as Jupyter's culler ends a kernel: idle is no typing, no output, no statement or cell computing [its time limit only].",
    ),
    pty: bool = typer.Option(
        False,
        "--pty",
        help="gq run: run the command on this terminal once it starts (as srun --pty), its exit status gq's; Ctrl-C while it is pending cancels it. A bare python (or ipython) is a REPL whose statements hold the device only while they run.",
    ),
) -> None:
    params = dict(ctx.params)
    given = {
        name
        for name in params
        if (source := ctx.get_parameter_source(name)) is not None and source.name == "COMMANDLINE"
    }
    code = submission.queue(
        ctx.info_name == "run",
        params,
        given,
        functools.partial(read_directive, ctx.command, parent=ctx.parent),
    )
    if code:
        raise typer.Exit(code)


def read_directive(
    command: Any, tokens: list[str], script: str, line: int, prefix: str, parent: Any = None
) -> dict[str, Any]:
    """The options one directive names, read by click as ``command``'s line is (also for
    the directives gq/cli/quick.py does not read itself)."""
    where = f"{script}:{line}"
    try:
        parsed = command.make_context("gq submit", tokens + [str(script)], parent=parent)
    except typer.TyperException as exc:
        raise UserError(f"{where}: malformed {prefix} directive: {usage_message(exc)}") from None
    if parsed.params.get("args"):
        raise UserError(
            f"{where}: malformed {prefix} directive: unexpected {' '.join(parsed.params['args'])!r}"
        )
    if parsed.params.get("script") != str(script):  # the last option took it as its value
        raise UserError(f"{where}: malformed {prefix} directive: {tokens[-1]} needs a value")
    return {
        name: value
        for name, value in parsed.params.items()
        if name != "script" and parsed.get_parameter_source(name).name == "COMMANDLINE"
    }

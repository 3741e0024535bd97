"""A submission's request: its options checked as far as they can be without the daemon
(units, paths, the interpreter, as the caller), and made the plain fields of
gq.messages.Submit that :func:`gq.cli.submission.queue` sends.

On gq submit's start-up path (gq/cli/quick.py), so it imports no typing, dataclasses, enum,
re or json, and the parsers of the options a line does not give (Slurm's, arrays',
dependencies') only for a line that gives them.
"""

from __future__ import annotations

import binascii
import os
import sys
import time

from gq import defaults, validation
from gq.errors import UserError
from gq.home import absolute
from gq.units import parse_duration, parse_seconds, parse_size, parse_when

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any


def build(options: dict[str, Any], content: bytes) -> dict[str, Any]:
    """Check what needs no daemon (units, paths, the interpreter, as the caller), then build
    the request's fields (gq.messages.Submit's, as the wire carries them); the daemon checks
    them all again, and the rest against the node."""
    script = absolute(options["script"])
    validation.text(script, f"script path {script[:60]!r}", defaults.MAX_PATH)
    gpus, gpu_type = _devices(options)
    validation.integer(gpus, "--gpus", 0, defaults.MAX_GPUS)
    steps = options["steps"]
    if steps is not None and steps <= 0:
        raise UserError(f"invalid --steps {steps}: must be a positive number of iterations")
    if steps is not None:
        validation.integer(steps, "--steps", 1, validation.INT64_MAX)
    validation.integer(
        options["priority"], "--priority", -defaults.MAX_PRIORITY, defaults.MAX_PRIORITY
    )
    if options["job_name"] is not None:
        validation.job_name(options["job_name"])
    for flag in ("output", "error"):
        if options[flag] is not None:
            validation.text(options[flag], f"--{flag} {options[flag][:60]!r}", defaults.MAX_PATH)
    device_mem = options["gpu_mem"] if options["gpu_mem"] is not None else options["mem"]
    mem = parse_size(device_mem) if device_mem is not None else None
    cpus = _count(options["cpus_per_task"], "--cpus-per-task")
    host_mem = _host_memory(options, gpus, cpus)
    limit = options["time_limit"]
    if limit is not None:
        from gq.slurm.options import is_unlimited

        limit = None if is_unlimited(limit) else parse_duration(limit)
    now = time.time()
    deadline = parse_when(options["deadline"], now) if options["deadline"] is not None else None
    begin = parse_when(options["begin"], now, "--begin") if options["begin"] is not None else None
    warn = None
    if options["warn_signal"] is not None:
        from gq.slurm.options import parse_signal

        warn = str(parse_signal(options["warn_signal"]))
    workdir = absolute(options["chdir"]) if options["chdir"] else os.getcwd()
    validation.text(workdir, f"working directory {workdir[:60]!r}", defaults.MAX_PATH)
    if not os.path.isdir(workdir):
        raise UserError(f"--chdir {workdir} is not a directory")
    interpreter = None
    if os.path.splitext(script)[1] == ".py":
        interpreter = os.path.abspath(options["python"] or sys.executable)
        validation.text(interpreter, f"--python {interpreter[:60]!r}", defaults.MAX_PATH)
        if not os.access(interpreter, os.X_OK) or os.path.isdir(interpreter):
            raise UserError(f"--python {interpreter} is not an executable interpreter")
    elif options["python"]:
        raise UserError("--python applies only to .py scripts")
    if options["dependency"] and options["after"]:
        raise UserError("give either --dependency or --after, not both")
    dependency = options["dependency"] or (
        f"afterok:{options['after']}" if options["after"] else None
    )
    if dependency is not None:
        from gq.queue import dependencies

        dependencies.parse(dependency)
    if options["array"]:
        from gq.queue import arrays

        arrays.parse(options["array"])
    args = list(options["args"] or [])
    env = dict(os.environ)
    # What sbatch records of the submission (the job's other SLURM_* come from the daemon).
    env.update(SLURM_SUBMIT_DIR=os.getcwd(), SLURM_SUBMIT_HOST=os.uname().nodename)
    validation.payload(env, args)
    umask = os.umask(0o022)
    os.umask(umask)
    submit_options = {
        "name": options["job_name"],
        "gpus": gpus,
        "gpu_type": gpu_type,
        "mem": mem,
        "host_mem": host_mem,
        "cpus": cpus,
        "time_limit": limit,
        "deadline": deadline,
        "begin": begin,
        "warn_signal": warn,
        "nodelist": _device_names(options["nodelist"]),
        "ntasks": _count(options["ntasks"], "--ntasks"),
        "notify": options["notify"],
        "mail_type": options["mail_type"],
        "mail_user": options["mail_user"],
        "retries": _retries(options),
        "retry_delay": _retry_delay(options["retry_delay"]),
        "oom": _on_oom(options["oom"]),
        "priority": options["priority"],
        "steps": steps,
        "output": options["output"],
        "error": options["error"],
        "exclusive": options["exclusive"],
        "requeue": options["requeue"],
        "interpreter": interpreter,
        "array": options["array"],
        "dependency": dependency,
        "held": options["hold"],
        "interactive": False,
        "idle_timeout": _idle_timeout(options.get("idle_timeout")),
    }
    return {
        "script_path": script,
        "script": binascii.b2a_base64(content, newline=False).decode("ascii"),
        "args": args,
        "command": options.get("command"),  # the command line as given (gq show's)
        "workdir": workdir,
        "env": env,
        "umask": umask,
        "options": submit_options,
    }


def _idle_timeout(given: str | None) -> int | None:
    """--idle-timeout as -t spells a time (UNLIMITED: none)."""
    if given is None:
        return None
    from gq.slurm.options import is_unlimited

    if is_unlimited(given):
        return None
    try:
        return parse_duration(given)
    except UserError as exc:
        raise UserError(f"--idle-timeout: {exc}") from None


def _devices(options: dict[str, Any]) -> tuple[int, str | None]:
    """How many devices, of what type, from -G/--gpus, --gpus-per-node or --gres, whichever
    was given (1 shared device of any type if none)."""
    if options["gres"] is None and options["gpus"] is None and options["gpus_per_node"] is None:
        return 1, None
    from gq.slurm import options as slurm_options

    if options["gres"] is not None:
        gpus = slurm_options.parse_gres(options["gres"])
    else:
        gpus = (
            slurm_options.parse_gpus(options["gpus"], "--gpus")
            if options["gpus"] is not None
            else slurm_options.parse_gpus(options["gpus_per_node"], "--gpus-per-node")
        )
    return gpus.count, gpus.type


def _host_memory(options: dict[str, Any], gpus: int, cpus: int | None) -> int | None:
    """Host memory in bytes from --host-mem (#SBATCH --mem), --mem-per-cpu or --mem-per-gpu;
    None for no limit (none given, or 0 as sbatch's --mem=0)."""
    for name, times in (("host_mem", 1), ("mem_per_cpu", cpus or 1), ("mem_per_gpu", max(gpus, 1))):
        text = options[name]
        if text is None:
            continue
        if text.strip() in ("0", "0M", "0G"):
            return None
        size = parse_size(text) * times
        validation.integer(size, f"--{name.replace('_', '-')}", 1, defaults.MAX_HOST_MEM)
        return size
    return None


def _device_names(text: str | None) -> list[str] | None:
    """-w gpu0,gpu2: the names, each once (the daemon checks that they exist)."""
    if text is None:
        return None
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or any(not n.isprintable() or len(n) > 64 for n in names):
        raise UserError(
            f"invalid --nodelist {text[:60]!r}: give device names such as gpu0,gpu2 (see 'gq info')"
        )
    return names


def _on_oom(value: str) -> str:
    """--oom as gq.messages.OnOutOfMemory's value (imported only for another than the
    default)."""
    wanted = value.strip().lower()
    if wanted != defaults.ON_OOM:
        from gq.messages import OnOutOfMemory

        try:
            OnOutOfMemory(wanted)
        except ValueError:
            raise UserError(f"--oom {value!r}: use requeue or fail") from None
    return wanted


def _retries(options: dict[str, Any]) -> int | None:
    retries = options["retries"]
    if retries is not None:
        validation.integer(retries, "--retries", 0, defaults.MAX_RETRIES)
    elif options["retry_delay"] is not None:
        raise UserError("--retry-delay applies with --retries N")
    return retries


def _retry_delay(text: str | None) -> float | None:
    return parse_seconds(text, "--retry-delay") if text is not None else None


def _count(value: int | None, flag: str) -> int | None:
    if value is not None:
        validation.integer(value, flag, 1, defaults.MAX_CPUS)
    return value

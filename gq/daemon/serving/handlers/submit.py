"""gq submit: check the request against the node, store the snapshot, queue the job.

The client parsed the command line and the directives; everything is checked again here,
since the daemon trusts no client. The script arrives as bytes the client read with its own
rights: the daemon never opens the user's path (no confused deputy).
"""

from __future__ import annotations

import os
import time
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

import psutil

from gq import defaults, messages, validation
from gq.daemon import devices as devices_mod
from gq.daemon.devices import gpu_capacity
from gq.daemon.forecasts.forecasting import WhatIf
from gq.daemon.scheduling import admission
from gq.daemon.serving.access import Caller, check_priority
from gq.daemon.serving.handlers.common import check_dependency, output_resolver
from gq.daemon.supervision.notify import MAIL_TYPES, SBATCH_ONLY_MAIL_TYPES
from gq.errors import Refused, UserError
from gq.queue import arrays, dependencies, spool, spool_usage, stats, submissions
from gq.slurm.options import GPU_TYPE, parse_signal
from gq.units import format_size

if TYPE_CHECKING:
    from gq.daemon.serving.handlers.node_view import NodeView


def submit(
    daemon: NodeView, caller: Caller, request: messages.Submit
) -> messages.Submitted | WhatIf:
    """Queue the job; with --test-only, check it the same way and queue nothing: the next
    forecast answers when and where it would run (a :class:`WhatIf`)."""
    if daemon.stopping:
        raise UserError("the daemon is stopping; submit again once it has restarted", 1)
    if not daemon.home.system and caller.uid != os.geteuid():
        raise Refused(
            f"this is uid {os.geteuid()}'s personal gq daemon; it runs no jobs for {caller.name}"
        )
    new = _validate(daemon, caller, request)
    if request.test_only:
        with daemon.db.read() as session:
            check_dependency(session, new.dependency)
            _check_pending_limit(daemon, session, caller, len(new.array_tasks or (None,)))
        return daemon.forecaster.what_if(new, caller.uid)
    script = PurePosixPath(request.script_path)
    written: list[int] = []  # a snapshot written for a submission that may not commit

    def snapshot(first_id: int) -> str:  # an array's id is its first task's
        written.append(first_id)
        return str(spool.snapshot(daemon.home, first_id, script.name, request.script))

    try:
        with daemon.db.write() as session:
            check_dependency(session, new.dependency)
            _check_pending_limit(daemon, session, caller, len(new.array_tasks or (None,)))
            dropped = _make_room_in_spool(daemon, session, caller, new.spool_bytes)
            job_id = submissions.submit(
                session, new, output_resolver(new.name, new.user, new.workdir), snapshot
            )[0]
    except BaseException:
        for first_id in written:
            spool.discard(daemon.home, first_id)
        raise
    spool.discard_snapshots(daemon.home, dropped)
    daemon.rescan()
    return messages.Submitted(job_id)


def _validate(daemon: NodeView, caller: Caller, request: messages.Submit) -> submissions.NewJob:
    options = request.options
    script = PurePosixPath(request.script_path)
    if not script.is_absolute() or not PurePosixPath(request.workdir).is_absolute():
        raise UserError("the script path and working directory must be absolute")
    if script.name in ("", ".", ".."):
        raise UserError(f"script {script} names no file")
    if len(request.script) > defaults.MAX_SCRIPT:
        raise UserError(
            f"script {script} is over {defaults.MAX_SCRIPT >> 20} MiB; submit a "
            "smaller script that reads its data from files"
        )
    validation.payload(request.env, request.args)
    if request.command is not None:
        validation.text(request.command, "the command line", defaults.MAX_COMMAND)
    if options.name is not None:
        validation.job_name(options.name)
    if b"\0" in request.script[:8192]:
        raise UserError(f"script {script} is a binary file; submit a script that runs it")
    if options.gpus < 0:
        raise UserError(f"invalid --gpus {options.gpus}: must be 0 or more")
    if options.steps is not None and options.steps <= 0:
        raise UserError(f"invalid --steps {options.steps}: must be a positive number of iterations")
    for name, value in (("--gpu-mem", options.mem), ("--time", options.time_limit)):
        if value is not None and value <= 0:
            raise UserError(f"invalid {name} {value}: must be greater than zero")
    if options.deadline is not None and options.deadline <= time.time():
        raise UserError(f"--deadline {_local(options.deadline)} has passed; give a later one")
    check_priority(daemon.rules, caller, options.priority, None)
    capacity = gpu_capacity(daemon.devices)
    if options.gpus > capacity:
        raise UserError(
            f"--gpus {options.gpus} is more than this node has ({capacity}); see 'gq info'"
        )
    on_gpus = options.gpus > 0 and any(d.kind == "cuda" for d in daemon.devices)
    usable = [d for d in daemon.devices if (d.kind == "cuda") == on_gpus]
    if options.gpu_type is not None:
        if not GPU_TYPE.fullmatch(options.gpu_type) or options.gpus == 0:
            raise UserError(
                f"invalid --gpus type {options.gpu_type[:40]!r}: a type names "
                "one or more devices, such as a100:1"
            )
        usable = _of_type(daemon, options.gpu_type, options.gpus)
    if options.nodelist is not None:
        usable = _pinned(daemon, options.nodelist, usable, options.gpus)
    largest = max(daemon.lane_memory(d) for d in usable)
    if options.mem is not None and options.mem > largest:
        lanes = f" per lane ({daemon.options.lanes} lanes)" if daemon.options.lanes > 1 else ""
        raise UserError(
            f"--gpu-mem {format_size(options.mem)} is more than any device of "
            f"this node has{lanes} ({format_size(largest)}); see 'gq info'"
        )
    cores = os.cpu_count() or 1
    if options.cpus is not None and options.cpus > cores:
        raise UserError(f"--cpus-per-task {options.cpus} is more than this node has ({cores})")
    ram = psutil.virtual_memory().total
    if options.host_mem is not None and options.host_mem > ram:
        raise UserError(
            f"host memory {format_size(options.host_mem)} (--mem in #SBATCH "
            f"lines, --host-mem) is more than this node has ({format_size(ram)})"
        )
    is_python = script.suffix == ".py"
    if is_python and not (options.interpreter and os.path.isabs(options.interpreter)):
        raise UserError("a .py script needs an interpreter given by its absolute path")
    if (
        options.interactive
        and not is_python
        and not options.exclusive
        and admission.has_devices_alone(
            False, False, options.gpus, any(d.whole for d in daemon.devices)
        )
    ):
        # A batch shell job takes its device alone; a terminal would hold one for the day.
        raise UserError(
            "a shell on a terminal would use its device outside gq's lanes: give "
            "-G 0 for none, --exclusive for a device of its own, or run python or "
            "ipython, whose statements hold a shared device only while they run"
        )
    if not is_python and options.interpreter:
        raise UserError("--python applies only to .py scripts")
    dependency = (
        str(dependencies.parse(options.dependency)) if options.dependency is not None else None
    )
    tasks = arrays.parse(options.array) if options.array else None
    _check_interactive(options)
    if tasks is not None and tasks.size > daemon.options.max_array:
        raise UserError(
            f"--array {options.array}: {tasks.size} tasks is more than this node "
            f"allows in one array ({daemon.options.max_array}, the daemon's "
            "--max-array)"
        )
    return submissions.NewJob(
        name=options.name or _name_of(script),
        user=caller.name,
        uid=caller.uid,
        gid=caller.gid,
        script=str(script),
        args=list(request.args),
        command=request.command,
        interpreter=options.interpreter if is_python else None,
        workdir=request.workdir,
        output_pattern=options.output,
        error_pattern=options.error or options.output,
        env=dict(request.env),
        umask=request.umask & 0o777,
        gpus=options.gpus,
        mem=options.mem,
        time_limit=options.time_limit,
        deadline=options.deadline,
        steps_total=options.steps,
        priority=options.priority,
        host_mem=options.host_mem,
        cpus=options.cpus,
        gpu_type=options.gpu_type,
        begin_time=options.begin,
        warn_signal=str(parse_signal(options.warn_signal)) if options.warn_signal else None,
        nodelist=",".join(options.nodelist) if options.nodelist else None,
        retries=options.retries,
        retry_delay=options.retry_delay,
        ntasks=options.ntasks,
        notify=_notify(options.notify),
        mail_type=_mail_type(options.mail_type),
        mail_user=_mail_user(options.mail_user),
        on_oom=_on_oom(options),
        exclusive=options.exclusive,
        requeue=options.requeue,
        dependency=dependency,
        held=options.held,
        interactive=options.interactive,
        idle_timeout=options.idle_timeout,
        array_tasks=tasks.tasks() if tasks else None,
        array_max_running=tasks.max_running if tasks else None,
        spool_bytes=spool.footprint(len(request.script)),
    )


def _check_interactive(options: messages.SubmitOptions) -> None:
    """An interactive job is one run on one terminal: nothing may run it again (a terminal
    cannot be handed to a later run), and only it may leave its output to the terminal."""
    validation.idle_timeout(options.interactive, options.idle_timeout)
    if not options.interactive:
        if options.output is None:
            raise UserError("--output needs a file name (only gq run --pty writes to the terminal)")
        return
    for given, flag in (
        (options.array, "--array"),
        (options.requeue, "--requeue"),
        (options.retries, "--retries"),
    ):
        if given:
            raise UserError(f"--pty runs one job on your terminal: it takes no {flag}")


def _on_oom(options: messages.SubmitOptions) -> str | None:
    """--oom as the row keeps it (None: requeue). A terminal cannot be handed to a later
    run: an interactive job that runs out of memory fails."""
    if options.interactive:
        return messages.OnOutOfMemory.FAIL.value
    return None if options.oom is messages.OnOutOfMemory.REQUEUE else options.oom.value


def _of_type(daemon: NodeView, gpu_type: str, count: int) -> list:
    """The devices of that type, enough of them for the job; else refused, naming the
    node's types."""
    matching = devices_mod.of_type(daemon.devices, gpu_type)
    if len(matching) < max(count, 1):
        have = ", ".join(devices_mod.types(daemon.devices)) or "none: jobs run on its cpu"
        raise UserError(
            f"--gpus {gpu_type}:{count}: this node has "
            f"{len(matching) or 'no'} device(s) of type {gpu_type!r} (its "
            f"models: {have}); give a type they name, or no type"
        )
    return matching


def _pinned(daemon: NodeView, names: list[str], usable: list, count: int) -> list:
    """-w: the named devices, which must exist and be of the kind (and type) the job asks
    for, enough of them."""
    known = {d.name for d in daemon.devices}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(
            f"--nodelist names no device {', '.join(unknown)} of this node (its "
            f"devices: {', '.join(sorted(known))})"
        )
    pinned = [d for d in usable if d.name in names]
    if len(pinned) < max(count, 1):
        raise UserError(
            f"--nodelist {','.join(names)} leaves {len(pinned)} device(s) this "
            f"job may use; it asks for {max(count, 1)} (see 'gq info')"
        )
    return pinned


def _notify(command: str | None) -> str | None:
    if command is None:
        return None
    validation.text(command, "--notify", defaults.MAX_TEXT)
    if not command.strip():
        raise UserError("--notify needs a command, such as --notify 'notify-send done'")
    return command


def _mail_type(text: str | None) -> str | None:
    """sbatch's --mail-type, checked: NONE, BEGIN, END, FAIL, REQUEUE, ALL, comma-separated;
    sbatch's other kinds (TIME_LIMIT_80, ARRAY_TASKS, ...) are taken and send nothing."""
    if text is None:
        return None
    kinds = [kind.strip().upper() for kind in text.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in MAIL_TYPES + SBATCH_ONLY_MAIL_TYPES]
    if not kinds or unknown:
        raise UserError(f"invalid --mail-type {text[:40]!r}: use {', '.join(MAIL_TYPES)}")
    kept = [kind for kind in kinds if kind in MAIL_TYPES and kind != "NONE"]
    return ",".join(kept) or None


def _mail_user(address: str | None) -> str | None:
    """An address for the mail command's last argument: one printable word that no mail
    program could take for an option."""
    if address is not None and (
        not address or address.startswith("-") or not address.isprintable() or " " in address
    ):
        raise UserError(
            f"invalid --mail-user {address[:60]!r}: give one address, such as ann@example.org"
        )
    return address


def _name_of(script: PurePosixPath) -> str:
    """The default name, the script's file name, made printable for everyone's tables."""
    name = "".join(c if c.isprintable() else "?" for c in script.name)
    return name[: defaults.MAX_NAME] or "job"


def _check_pending_limit(daemon: NodeView, session, caller: Caller, adding: int) -> None:
    limit = daemon.options.max_pending
    pending = stats.pending_count(session, caller.name)
    if pending + adding > limit:
        raise UserError(
            f"{caller.name} has {pending} pending job(s); {adding} more would pass "
            f"this node's limit of {limit} pending jobs per user (the daemon's "
            "--max-pending); wait for some to start, or cancel some"
        )


def _make_room_in_spool(daemon: NodeView, session, caller: Caller, size: int) -> set[str]:
    """Room in the spool for a new snapshot (of ``size``, its footprint) within the user's
    --max-spool, counted by uid. The snapshots of
    their jobs that ended longest ago go first (those jobs can no longer be requeued or
    exported); refused when their unfinished jobs' alone leave no room. The paths to delete
    once the submission commits."""
    limit = daemon.options.max_spool
    kept = spool_usage.spool_bytes(session, caller.uid)
    excess = kept + size - limit
    if excess <= 0:
        return set()
    finished = spool_usage.finished_snapshots(session, caller.uid)
    droppable = sum(freed for _, freed in finished)
    if excess > droppable:
        unfinished = kept - droppable
        raise UserError(
            f"{caller.name}'s pending and running jobs keep "
            f"{format_size(unfinished)} of scripts in the spool; this "
            f"{format_size(size)} one would pass this node's limit of "
            f"{format_size(limit)} per user (the daemon's --max-spool); cancel "
            "some pending jobs, or wait for some to end"
        )
    freeing = []
    for payload_id, freed in finished:
        freeing.append(payload_id)
        excess -= freed
        if excess <= 0:
            break
    return spool_usage.drop_snapshots(session, caller.uid, freeing)


def _local(timestamp: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%dT%H:%M:%S")

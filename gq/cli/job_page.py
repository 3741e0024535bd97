"""gq show: one job's page, its fields as scontrol show job lists them, its runs (a
requeued job's, each with its wait, time, steps and lane time) and its state history; or
its JSON. Without typer, so that ``gq show`` runs from gq.cli.quick as well."""

from __future__ import annotations

import sys

from gq import client, messages
from gq.cli import listing, render
from gq.queue.arrays import parse_label
from gq.units import format_duration


def show(job_id: str, json_out: bool) -> None:
    """Ask the daemon for one job (an array's first tasks for its id) and print it."""
    answer = client.ask(messages.ShowJob(parse_label(job_id)))
    listing.note_stale(answer)
    if answer.more:
        print(
            f"gq: note: {answer.more} more tasks of array {job_id} not shown; 'gq show "
            f"{job_id}_N' shows one, 'gq status -r --json' lists them all",
            file=sys.stderr,
        )
    if json_out:
        data = [render.job_json(job) for job in answer.jobs]
        print(render.dumps(data[0] if len(data) == 1 else data))
        return
    for index, job in enumerate(answer.jobs):
        if index:
            print()
        print_job(job)


def _interactive(job: messages.JobInfo) -> str:
    """Whether it is on its submitter's terminal; its idle time and --idle-timeout."""
    if not job.interactive:
        return "no"
    said = "yes (on its submitter's terminal)"
    if job.idle is not None:
        said += f", idle {render.idle_time(job.idle)}"
    if job.idle_timeout is not None:
        said += f", ended when idle {format_duration(job.idle_timeout)} (--idle-timeout)"
    return said


def print_job(job: messages.JobInfo) -> None:
    lines = [
        ("JobId", job.label),
        ("Name", job.name),
        ("User", f"{job.user} (uid {job.uid})"),
        ("State", f"{job.state} ({render.state_label(job)})"),
        ("Reason", job.reason or "-"),
        ("Priority", job.priority),
        ("Command", render.command_line(job)),
        ("Interactive", _interactive(job)),
        ("WorkDir", job.workdir),
        ("StdOut", job.stdout or "(its terminal)"),
        ("StdErr", job.stderr or "(its terminal)"),
        ("Gpus", f"{job.gpu_type}:{job.gpus}" if job.gpu_type else job.gpus),
        ("GpuMem", render.memory_figure(job)),
        (
            "OutOfMemory",
            f"{job.on_oom.value}" + (f" ({job.ooms} run(s) ran out so far)" if job.ooms else ""),
        ),
        ("HostMem", render.size(job.host_mem) if job.host_mem else "-"),
        ("CpusPerTask", job.cpus or "-"),
        ("TimeLimit", render.duration(job.time_limit) if job.time_limit else "UNLIMITED"),
        ("BeginTime", render.short_time(job.begin_time) if job.begin_time else "-"),
        ("Signal", job.warn_signal or "-"),
        ("NodeList", job.nodelist or "-"),
        (
            "Retries",
            f"{job.retries - (job.retries_left or 0)} of {job.retries} used"
            if job.retries
            else "-",
        ),
        ("Deadline", _deadline_line(job)),
        ("Exclusive", "yes" if job.exclusive else "no"),
        ("Requeue", "yes" if job.requeue else "no"),
        ("Dependency", job.dependency or "-"),
        ("Held", "yes" if job.held else "no"),
        ("Preempted", _preempted(job)),
        ("Device", f"{job.device or '-'}" + (f" lane {job.lane}" if job.lane is not None else "")),
        ("SubmitTime", render.short_time(job.submit_time)),
        ("StartTime", render.short_time(job.start_time)),
        ("EndTime", render.short_time(job.end_time)),
        ("WaitTime", _total(job, render.duration(render.wait_time(job)))),
        (
            "RunTime",
            _total(job, render.duration(render.run_time(job)))
            + (
                f"; run {job.run_count} {render.duration(render.elapsed(job))}"
                if job.run_count > 1 and job.start_time is not None
                else ""
            ),
        ),
        ("Forecast", _forecast_line(job)),
        ("ExitCode", "-" if job.exit_code is None else job.exit_code),
        ("Steps", _steps(job)),
        ("MeanIteration", f"{job.mean_iteration * 1000:.2f} ms" if job.mean_iteration else "-"),
        ("MeanGap", f"{job.mean_gap * 1000:.2f} ms" if job.mean_gap is not None else "-"),
        ("AttainedDeviceTime", _total(job, f"{render.lane_time(job):.2f} s")),
        ("LaneTaken", _lane_taken(job)),
        ("IterationsPerSecond", figure(render.iteration_rate(job), "{:.1f}")),
        ("LaneShare", figure(render.lane_share(job), "{:.0%}")),
        ("SideBySide", _side_by_side(job)),
        ("MemPersistent", render.size(job.mem_persistent)),
        ("MemPeak", render.size(job.mem_peak)),
        ("HostMemory", render.size(job.host_memory)),
        ("DeviceMemory", _device_memory(job)),
        ("Processes", "-" if job.processes is None else job.processes),
        ("Tasks", _tasks(job)),
        ("Runs", job.run_count),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key:>{width}}: {render.printable(value)}")
    if job.runs:
        print("\nRuns:")
        print(_indented(render.table(_RUN_COLUMNS, [_run_row(run) for run in job.runs])))
    print("\nState history:")
    for event in job.events or []:
        old = event.old_state or "-"
        reason = f"  ({event.reason})" if event.reason else ""
        print(
            render.printable(
                f"  {render.short_time(event.time)}  {old:>9} -> {event.new_state}{reason}"
            )
        )


def _total(job: messages.JobInfo, figure: str) -> str:
    """A figure summed over a requeued job's runs, said so."""
    return f"{figure} (its {job.run_count} runs)" if job.run_count > 1 else figure


def _steps(job: messages.JobInfo) -> str:
    """The steps it reached, of its total; where a later run completed it, what that run
    counted (a run resumed from a checkpoint counts its own steps, from there on)."""
    text = f"{render.steps_reached(job)}/{job.steps_total or '?'}"
    if render.resumed_and_done(job):
        text += f" (the job completed; run {job.run_count} counted {job.steps_done})"
    return text


_RUN_COLUMNS = ["RUN", "START", "END", "ENDED", "EXIT", "WAIT", "RUN TIME", "STEPS", "LANE"]
_RUN_COLUMNS += ["DEVICE", "REASON"]


def _run_row(run: messages.RunInfo) -> list[str]:
    """One run of gq show's table of runs: how it ended (a state, REQUEUED; RUNNING while
    it runs) and why, its wait before it, its time, its own count of steps, its lane time."""
    figures = render.run_json(run)
    return [
        str(run.run),
        render.short_time(run.start_time),
        render.short_time(run.end_time),
        run.ended or "RUNNING",
        "-" if run.exit_code is None else str(run.exit_code),
        render.duration(figures["wait_time"]),
        render.duration(figures["run_time"]),
        f"{run.steps_done}/{run.steps_total or '?'}",
        f"{run.attained:.2f}s",
        run.device or "-",
        run.reason or "",
    ]


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _forecast_line(job: messages.JobInfo) -> str:
    """When the job should start and end, as the daemon's last forecast has it."""
    if job.forecast is None:
        return "-"
    if job.forecast == "unknown":
        return "unknown (no --steps, --time or earlier runs of this name to go on)"
    start = (
        "" if job.start_time is not None else (f"start {render.forecast_time(job, end=False)}, ")
    )
    return f"{start}end {render.forecast_time(job, end=True)}" + _FORECAST_BASIS.get(
        job.forecast, ""
    )


_FORECAST_BASIS = {
    "estimated": " (estimated)",
    "guessed": " (a first guess from time limits: not forecast yet; ask again in a second)",
}


def _lane_taken(job: messages.JobInfo) -> str:
    """How often its device was taken from it inside an iteration (--max-hold)."""
    if not job.lane_taken:
        return "never"
    return (
        f"{job.lane_taken} time(s): its iterations held the device past the policy's "
        "--max-hold while another job waited, so they ran sliced"
    )


def _side_by_side(job: messages.JobInfo) -> str:
    """How fast its lane time went, side by side, against taking turns (what its owner's
    fair share was charged)."""
    pace = render.pace_side_by_side(job)
    if pace is None:
        return "never (its lane time was charged whole)"
    return (
        f"{pace:.2f}x the pace of taking turns: charged "
        f"{render.charged_time(job):.2f} s of its {render.lane_time(job):.2f} s of lane time"
    )


def _preempted(job: messages.JobInfo) -> str:
    """Whether the daemon moved the job out, and for what: a higher job, or its turn over
    (--rotate; its reason says so)."""
    if not job.preempted:
        return "no"
    if (job.reason or "").startswith("Rotated out"):
        return "yes: rotated out after its turn; it comes back in its turn"
    return "yes: suspended for a higher-priority job; it comes back once that leaves room"


def _device_memory(job: messages.JobInfo) -> str:
    """Where a suspended job's device memory went (gq suspend moves it to host memory where
    the driver can), or why it stayed on the device."""
    took = f" (the move took {job.memory_took:.2f} s)" if job.memory_took is not None else ""
    if job.memory_place is None:
        return "on the device"
    if job.memory_place == "host":
        moved = render.size(job.memory_moved)
        back = "" if job.suspended else "; it resumes once that much is free on its device"
        return f"{moved} in host memory, the device freed{took}{back}"
    if job.memory_place == "device" and job.memory_held:
        return f"held on the device while suspended: {job.memory_held}"
    if job.memory_place == "device":
        return f"on the device, brought back from host memory{took}"
    return job.memory_place  # on its way: "moving to host memory", "moving back ..."


def _tasks(job: messages.JobInfo) -> str:
    """Its tasks now, against its limit, and the forks refused there (its pids cgroup's)."""
    if job.pids_current is None:
        return "-"
    limit = "" if job.pids_max is None else f" of at most {job.pids_max}"
    refused = f"; {job.pids_refused} forks refused at the limit" if job.pids_refused else ""
    return f"{job.pids_current}{limit}{refused}"


def figure(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _deadline_line(job: messages.JobInfo) -> str:
    if job.deadline is None:
        return "-"
    text = render.short_time(job.deadline)
    predicted = render.predicted_end(job)
    if predicted is not None:
        text += f" (predicted end {render.short_time(predicted)})"
    missed = render.deadline_miss(job)
    if missed is not None:
        text += f"; misses it by {render.duration(missed)}"
    return text

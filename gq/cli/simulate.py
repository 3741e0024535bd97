"""gq simulate: replay a job trace through the real policies on a simulated clock."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from gq import defaults
from gq.errors import UserError

if TYPE_CHECKING:
    from rich.progress import Progress

    from gq.sim.results import Result


def simulate(
    trace: Path = typer.Option(
        ..., "--trace", help="CSV: Tiresias layout or gq's (gq history --csv)."
    ),
    policy: str = typer.Option(
        "fifo", "--policy", help="fifo, srtf, fair, priority, rr or deadline."
    ),
    compare: Optional[str] = typer.Option(
        None, "--compare", help="Comma-separated policies to compare, e.g. fifo,srtf,fair,priority."
    ),
    gpus: int = typer.Option(1, "--gpus", help="Devices of the simulated node."),
    lanes: str = typer.Option(
        "auto",
        "--lanes",
        metavar="auto|N",
        help="Lanes per device, as gq daemon start --lanes: N run at once always; auto (the daemon's default) side by side only where the host measures it pays, on up to 2 (a GPU's); a comma list (1,auto) compares them.",
    ),
    switch_cost: float = typer.Option(
        0.0, "--switch-cost", help="Seconds a device pays to change job."
    ),
    fill: str = typer.Option("always", "--fill", help="priority only: always, gapfit or never."),
    quantum: str = typer.Option(
        "100ms", "--quantum", help="rr only: device time (100ms) or iterations (10it) per turn."
    ),
    move_margin: float = typer.Option(
        defaults.MOVE_MARGIN,
        "--move-margin",
        metavar="SECONDS",
        help="As the daemon's: under fifo, a job that has run no iteration moves to a device that would start it this much sooner.",
    ),
    backfill: bool = typer.Option(
        True,
        "--backfill/--no-backfill",
        help="EASY backfill of jobs whose time limit (the trace's, else their duration) ends before a blocked job's start.",
    ),
    share_slice: Optional[float] = typer.Option(
        None,
        "--share-slice",
        metavar="FRACTION",
        help="Jobs that would take turns every iteration take them in slices of this share of their iterations (fewer events, approximate) [0: exact; 0.001 for fair with --switch-cost].",
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print JSON, one object per policy and lane setting."
    ),
    jobs_csv: Optional[Path] = typer.Option(None, "--jobs-csv", help="Write per-job results here."),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="Draw timeline and JCT CDF (needs matplotlib)."
    ),
) -> None:
    """What would each policy have done with these jobs? Same policy code, simulated clock.

    Prints average, median and p95 job completion time (JCT = end - submit), makespan and
    device utilization, for each policy and lane setting. Example: gq simulate --trace
    jobs.csv --compare fifo,srtf,fair --lanes 1,auto
    """
    from gq import policies
    from gq.cli import render
    from gq.sim.simulator import simulate as run_simulation
    from gq.sim.traces import load

    names = [n.strip() for n in compare.split(",")] if compare else [policy]
    for name in names:
        if name not in policies.NAMES:
            raise UserError(f"unknown policy {name!r}; choose from {', '.join(policies.NAMES)}")
    if fill not in policies.FILL_MODES:
        raise UserError(f"unknown --fill {fill!r}; choose one of {', '.join(policies.FILL_MODES)}")
    try:
        policies.make("rr", fill, quantum)
    except ValueError as exc:
        raise UserError(f"--quantum: {exc}") from None
    if gpus < 1:
        raise UserError(f"invalid --gpus {gpus}: the simulated node needs at least 1 device")
    settings = lane_settings(lanes)
    if switch_cost < 0:
        raise UserError(f"invalid --switch-cost {switch_cost}: must not be negative")
    if not 0 <= move_margin < 1e9:
        raise UserError(f"invalid --move-margin {move_margin}: seconds, 0 or more")
    if share_slice is not None and not 0 <= share_slice <= 1:
        raise UserError(f"invalid --share-slice {share_slice}: a fraction from 0 to 1")
    if plot is not None:
        _require_matplotlib()
    jobs = load(trace)
    runs = [(setting, name) for setting in settings for name in names]
    with _ProgressBar(len(runs) * len(jobs)) as bar:
        results: list[Result] = []
        for (_, count, measured), name in runs:
            results.append(
                run_simulation(
                    jobs,
                    policies.make(name, fill, quantum),
                    gpus=gpus,
                    switch_cost=switch_cost,
                    backfill=backfill,
                    share_slice=share_slice,
                    lanes=count,
                    packing=measured,
                    move_margin=move_margin,
                    progress=bar.after(len(results) * len(jobs)),
                )
            )
    summaries = [
        {**result.summary(), "lanes": label} for result, ((label, _, _), _) in zip(results, runs)
    ]
    if jobs_csv is not None:
        _write_jobs(results, jobs_csv)
    if plot is not None:
        from gq.sim.plot import draw

        draw(results, plot)
    if json_out:
        typer.echo(render.dumps(summaries if len(summaries) > 1 or compare else summaries[0]))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title=f"{trace.name}: {len(jobs)} jobs on {gpus} device(s)",
        title_justify="left",
    )
    with_deadlines = summaries[0]["deadlines_met"] is not None
    columns = ["POLICY", "LANES", "AVG JCT", "MEDIAN JCT", "P95 JCT", "MAKESPAN", "UTIL", "VS FIFO"]
    for column in columns + (["DEADLINES MET"] if with_deadlines else []):
        table.add_column(column, justify="left" if column == "POLICY" else "right")
    for s in summaries:
        baseline = next(
            (b["avg_jct"] for b in summaries if b["policy"] == "fifo" and b["lanes"] == s["lanes"]),
            None,
        )
        ratio = f"{baseline / s['avg_jct']:.2f}x" if baseline else "-"
        met = [f"{100 * s['deadlines_met']:.0f}%"] if with_deadlines else []
        table.add_row(
            s["policy"],
            s["lanes"],
            f"{s['avg_jct']:.1f}",
            f"{s['median_jct']:.1f}",
            f"{s['p95_jct']:.1f}",
            f"{s['makespan']:.1f}",
            f"{100 * s['utilization']:.1f}%",
            ratio,
            *met,
        )
    Console(highlight=False).print(table)


def lane_settings(text: str) -> list[tuple[str, int, bool]]:
    """``--lanes``: each comma-separated setting as (what it was called, lanes, measured):
    a count fixes that many lanes at once; ``auto`` lets the simulated host's packer choose
    on up to a GPU's lanes (gq.exec.lane.packing). UserError naming the setting: anything
    else, an empty one, a count out of range."""
    from gq.exec.lane import packing

    settings = []
    for item in text.split(","):
        item = item.strip().lower()
        if item == "auto":
            settings.append((item, packing.most_lanes(cuda=True), True))
            continue
        try:
            count = int(item)
        except ValueError:
            what = repr(text[:40]) if not item else repr(item[:40])
            raise UserError(
                f"invalid --lanes {what}: give a count of lanes (1 to {defaults.MAX_LANES}) "
                "or auto, several comma-separated (1,auto)"
            ) from None
        if not 1 <= count <= defaults.MAX_LANES:
            raise UserError(
                f"invalid --lanes {count}: a device has at least 1 lane and at most "
                f"{defaults.MAX_LANES}"
            )
        settings.append((str(count), count, False))
    return settings


class _ProgressBar:
    """A progress bar on stderr (a terminal only) for a simulation that runs longer than a
    second; called with the jobs finished so far."""

    DELAY = 1.0

    def __init__(self, total: int):
        import sys
        import time

        self.total = total
        self.started = time.monotonic()
        self.clock = time.monotonic
        self.shown: Progress | None = None
        self.wanted = sys.stderr.isatty()

    def __enter__(self) -> _ProgressBar:
        return self

    def after(self, before: int) -> Callable[[int, int], None]:
        """The progress callback of a run that follows others, which ended ``before`` jobs."""
        return lambda done, total: self(before + done)

    def __call__(self, done: int) -> None:
        if not self.wanted or (self.shown is None and self.clock() - self.started < self.DELAY):
            return
        if self.shown is None:
            from rich.console import Console
            from rich.progress import Progress

            self.shown = Progress(console=Console(stderr=True), transient=True)
            self.shown.start()
            self.task = self.shown.add_task("simulating", total=self.total)
        self.shown.update(self.task, completed=done)

    def __exit__(self, *exc) -> None:
        if self.shown is not None:
            self.shown.stop()


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install 'gq[plot]'") from None


def _write_jobs(results, path: Path) -> None:
    try:
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(
                [
                    "policy",
                    "job_id",
                    "submit_time",
                    "start_time",
                    "end_time",
                    "jct",
                    "iterations",
                    "gpus",
                ]
            )
            for result in results:
                for run in result.runs:
                    writer.writerow(
                        [
                            result.policy,
                            run.job.id,
                            run.job.submit_time,
                            f"{run.start:.3f}",
                            f"{run.end:.3f}",
                            f"{run.end - run.job.submit_time:.3f}",
                            run.job.iterations,
                            run.gpus,
                        ]
                    )
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None

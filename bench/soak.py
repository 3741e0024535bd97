"""Soak: many tiny jobs through the real daemon; throughput and the daemon's memory.

  python bench/soak.py [--jobs 20000] [--batch 1000] [--prefill 10000] [--array N]
                       [--poll SECONDS | --cli SECONDS] [--single N] [--hog N]
                       [-- DAEMON_OPTIONS]

First fills the queue with --prefill finished jobs (written to it directly, as a month of
use leaves it), so that turnover is measured against a queue that holds them. Then submits
through gq's real CLI entry point (in this process, so that thousands of interpreter starts
do not dominate) in batches of --batch, one job at a time or as arrays of --array tasks,
waits until each batch has ended (reading the queue directly, so that the wait costs the
daemon nothing), reads the daemon's RSS, and checks that all COMPLETED. ``--poll`` runs
``gq status --json`` every so many seconds meanwhile, as a dashboard does; ``--single N``
runs N jobs one by one too, a batch after each batch of arrays on the same daemon, so that
array turnover is compared with single jobs' in one run (each over its own batches' time).
``--cli SECONDS`` is a user's script instead: each submission a whole ``gq submit``
process, each batch waited for by running ``gq status --json`` (a whole process) every so
many seconds until it lists no job, the RSS read also as the tasks ended pass each
multiple of 1,000 (``--batch`` as large as ``--jobs`` submits them all at once). ``--hog N``
keeps N busy loops (``python -c 'while 1: pass'``) beside it all, as other work on a small
machine.

Reports jobs per second overall and per batch, the daemon's RSS at the start, after the
first 1,000 jobs and at the end, and the growth between the last two and from the first to
the highest reading since (the daemon's memory should stay flat once warm), and the CPU
time per job (of either kind) of the daemon, the
hosts and the submitting client (where the time goes). Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument(
        "--batch",
        type=int,
        default=1000,
        help="submit this many, wait for them to end, read the RSS; again",
    )
    parser.add_argument(
        "--prefill",
        type=int,
        default=10000,
        help="finished jobs in the queue before the soak begins",
    )
    parser.add_argument(
        "--array",
        type=int,
        metavar="N",
        help="submit the jobs as arrays of N tasks (the batch a multiple of N)",
    )
    parser.add_argument(
        "--poll", type=float, metavar="SECONDS", help="run gq status --json every SECONDS meanwhile"
    )
    parser.add_argument(
        "--cli",
        type=float,
        metavar="SECONDS",
        help="submit with whole gq processes; wait for each batch by running "
        "gq status --json every SECONDS until it lists no job",
    )
    parser.add_argument(
        "--hog", type=int, default=0, metavar="N", help="N busy loops beside the soak"
    )
    parser.add_argument(
        "--single",
        type=int,
        default=0,
        metavar="N",
        help="with --array: N jobs one by one too, a batch after each "
        "array batch, for their turnover",
    )
    parser.add_argument(
        "daemon_args",
        nargs="*",
        metavar="-- DAEMON_OPTION",
        help="options for the daemon, such as -- --max-resident 16",
    )
    args = parser.parse_args()
    if args.array is not None and not 1 <= args.array <= args.batch:
        parser.error("--array N: N from 1 to the --batch size")
    if args.cli is not None and args.poll is not None:
        parser.error("--cli polls already: give --poll or --cli, not both")
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.hog)]
    try:
        soak(args)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def soak(args: argparse.Namespace) -> None:
    with Node(
        "--kill-wait", "1", "--max-pending", str(max(args.batch, 1000)), *args.daemon_args
    ) as node:
        os.environ["GQ_HOME"] = node.env["GQ_HOME"]
        os.chdir(node.dir)
        from gq.cli.main import main as gq_main

        def submit(*options: str) -> int:
            if args.cli is not None:  # a whole process, as a user's script runs it
                return node.submit(*options, str(script))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                if gq_main(["submit", "--parsable", *options, str(script)]) != 0:
                    raise RuntimeError("submit failed")
            return int(out.getvalue())

        def one_by_one(size: int) -> list[int]:
            return [submit() for _ in range(size)]

        def as_arrays(size: int) -> list[int]:
            ids = []
            for start in range(0, size, args.array):
                count = min(args.array, size - start)
                ids += node.array_task_ids(submit("--array", f"0-{count - 1}"))
            return ids

        def run_batch(phase: Phase, submit_batch: Callable[[int], list[int]], jobs: int) -> None:
            """One batch of the phase's ``jobs`` submitted and waited for."""
            batch_start = time.monotonic()
            ids = submit_batch(min(args.batch, jobs - phase.done))
            if args.cli is not None:

                def each_thousand() -> None:
                    """The RSS as the tasks ended so far pass each multiple of 1,000."""
                    ended = phase.done + node.ended(ids)
                    mark = (max(phase.rss_at, default=0) // 1000 + 1) * 1000
                    while mark <= ended:
                        phase.rss_at[mark] = daemon.memory_info().rss
                        mark += 1000

                phase.polls += until_empty(node, args.cli, each_thousand)
            for state, count in node.end_states(ids, timeout=3600).items():
                phase.states[state] = phase.states.get(state, 0) + count
            seconds = time.monotonic() - batch_start
            phase.per_batch.append(len(ids) / seconds)
            phase.seconds += seconds
            phase.done += len(ids)
            phase.rss_at[phase.done] = daemon.memory_info().rss

        script = node.dir / "tiny.sh"
        script.write_text("true\n")
        node.prefill(submit(), args.prefill)
        daemon = psutil.Process(int((node.dir / "home" / "daemon.pid").read_text()))
        rss_start = daemon.memory_info().rss
        poller = Poller(node, args.poll) if args.poll else contextlib.nullcontext()
        main_phase, single = Phase(), Phase()
        singles = args.single if args.array else 0
        with poller:
            while main_phase.done < args.jobs:
                run_batch(main_phase, as_arrays if args.array else one_by_one, args.jobs)
                if single.done < singles:  # between the array batches: drift hits both
                    run_batch(single, one_by_one, singles)
            while single.done < singles:
                run_batch(single, one_by_one, singles)
            cpu = {
                "daemon": _cpu_seconds(daemon),
                "hosts": sum(
                    _cpu_seconds(child)
                    for child in daemon.children()
                    if "gq.exec.host.startup" in " ".join(child.cmdline())
                ),
                "client": _cpu_seconds(psutil.Process()),
            }
    states, rss_at, per_batch, done = (
        main_phase.states,
        main_phase.rss_at,
        main_phase.per_batch,
        main_phase.done,
    )
    warm = min((n for n in rss_at if n >= 1000), default=min(rss_at))
    rss_end = rss_at[done]
    result = {
        "jobs": args.jobs,
        "prefilled_finished_jobs": args.prefill,
        "states": states,
        "array_size": args.array,
        "poll_seconds": args.poll,
        "cli_poll_seconds": args.cli,
        "hogs": args.hog,
        "polls": poller.count if args.poll else main_phase.polls + single.polls,
        "daemon_options": args.daemon_args,
        "total_seconds": main_phase.seconds,
        "jobs_per_second": done / main_phase.seconds,
        "jobs_per_second_by_batch": per_batch,
        "daemon_rss_start_mb": rss_start / 2**20,
        "daemon_rss_mb_by_jobs_ended": {n: rss / 2**20 for n, rss in rss_at.items()},
        "warm_after_jobs": warm,
        "daemon_rss_warm_mb": rss_at[warm] / 2**20,
        "daemon_rss_end_mb": rss_end / 2**20,
        "growth_warm_to_end_mb": (rss_end - rss_at[warm]) / 2**20,
        "growth_warm_to_highest_mb": (max(r for n, r in rss_at.items() if n >= warm) - rss_at[warm])
        / 2**20,
        "cpu_ms_per_job": {
            who: seconds * 1000 / (done + single.done) for who, seconds in cpu.items()
        },
    }
    if single.done:
        result["single"] = {
            "jobs": single.done,
            "states": single.states,
            "jobs_per_second": single.done / single.seconds,
            "jobs_per_second_by_batch": single.per_batch,
        }
        result["array_to_single_turnover"] = (
            result["jobs_per_second"] / result["single"]["jobs_per_second"]
        )
    print(json.dumps(result, indent=2))
    shape = f"in arrays of {args.array}" if args.array else "one by one"
    if args.cli is not None:
        shape += f" through whole gq processes, gq status --json every {args.cli} s"
    if args.hog:
        shape += f", {args.hog} busy loop(s) beside"
    print(
        f"\n{args.jobs} jobs {shape} after {args.prefill} finished ones: {states}; "
        f"{result['jobs_per_second']:.1f} jobs/s (batches {min(per_batch):.0f}-"
        f"{max(per_batch):.0f}); daemon RSS {result['daemon_rss_start_mb']:.1f} MB at start, "
        f"{result['daemon_rss_warm_mb']:.1f} MB after {warm} jobs, "
        f"{result['daemon_rss_end_mb']:.1f} MB after {done} "
        f"({result['growth_warm_to_end_mb']:+.1f} MB between them, "
        f"{result['growth_warm_to_highest_mb']:+.1f} to the highest); CPU per job: "
        + ", ".join(f"{who} {ms:.2f} ms" for who, ms in result["cpu_ms_per_job"].items())
    )
    if single.done:
        print(
            f"and {single.done} jobs one by one: {single.states}; "
            f"{result['single']['jobs_per_second']:.1f} jobs/s (arrays "
            f"{result['array_to_single_turnover']:.2f}x that)"
        )
    if states != {"COMPLETED": args.jobs} or single.states not in ({}, {"COMPLETED": single.done}):
        sys.exit(1)


@dataclass
class Phase:
    """Jobs submitted a batch at a time: how they ended, how fast (over the seconds of its
    own batches), the daemon's RSS after each."""

    seconds: float = 0.0
    done: int = 0
    states: dict[str, int] = field(default_factory=dict)
    per_batch: list[float] = field(default_factory=list)  # jobs per second
    rss_at: dict[int, int] = field(default_factory=dict)  # jobs ended so far -> the RSS then
    polls: int = 0  # gq status --json run to wait for the batches (--cli)


def until_empty(node: Node, period: float, after_each: Callable[[], None]) -> int:
    """Run ``gq status --json`` every ``period`` seconds until it lists no job, and
    ``after_each`` after each; how many ran."""
    polls = 0
    while True:
        polls += 1
        listed = json.loads(node.gq("status", "--json"))
        after_each()
        if not listed:
            return polls
        time.sleep(period)


class Poller:
    """``gq status --json`` every ``period`` seconds in a thread, each a whole process (as a
    dashboard polls), until the block ends."""

    def __init__(self, node: Node, period: float):
        self.node, self.period, self.count = node, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.node.gq("status", "--json")
            self.count += 1


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    main()

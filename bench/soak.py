"""Soak: many tiny jobs through the real daemon; throughput and the daemon's memory.

  python bench/soak.py [--jobs 20000] [--batch 1000] [--prefill 10000] [-- DAEMON_OPTIONS]

First fills the queue with --prefill finished jobs (written to it directly, as a month of
use leaves it), so that turnover is measured against a queue that holds them. Then submits
through gq's real CLI entry point (in this process, so that thousands of interpreter starts
do not dominate) in batches of --batch, waits until each batch has ended (reading the queue
directly, so that the wait costs the daemon nothing), reads the daemon's RSS, and checks that
all COMPLETED. Reports jobs per second overall and per batch, the daemon's RSS at the start,
after the first 1,000 jobs and at the end, and the growth between the last two (the daemon's
memory should stay flat once warm), and the CPU time per job of the daemon, the hosts and
the submitting client (where the time goes). Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=1000,
                        help="submit this many, wait for them to end, read the RSS; again")
    parser.add_argument("--prefill", type=int, default=10000,
                        help="finished jobs in the queue before the soak begins")
    parser.add_argument("daemon_args", nargs="*", metavar="-- DAEMON_OPTION",
                        help="options for the daemon, such as -- --max-resident 16")
    args = parser.parse_args()
    with Node("--kill-wait", "1", "--max-pending", str(max(args.batch, 1000)),
              *args.daemon_args) as node:
        os.environ["GQ_HOME"] = node.env["GQ_HOME"]
        os.chdir(node.dir)
        from gq.cli.main import main as gq_main

        def submit() -> int:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                if gq_main(["submit", "--parsable", str(script)]) != 0:
                    raise RuntimeError("submit failed")
            return int(out.getvalue())

        script = node.dir / "tiny.sh"
        script.write_text("true\n")
        node.prefill(submit(), args.prefill)
        daemon = psutil.Process(int((node.dir / "home" / "daemon.pid").read_text()))
        rss_start = daemon.memory_info().rss
        started = time.monotonic()
        states: dict[str, int] = {}
        rss_at: dict[int, int] = {}  # jobs ended so far -> the daemon's RSS then
        per_batch: list[float] = []
        done = 0
        while done < args.jobs:
            batch_start = time.monotonic()
            ids = [submit() for _ in range(min(args.batch, args.jobs - done))]
            for state, count in node.end_states(ids, timeout=3600).items():
                states[state] = states.get(state, 0) + count
            per_batch.append(len(ids) / (time.monotonic() - batch_start))
            done += len(ids)
            rss_at[done] = daemon.memory_info().rss
        finished = time.monotonic()
        cpu = {"daemon": _cpu_seconds(daemon),
               "hosts": sum(_cpu_seconds(child) for child in daemon.children()
                            if "gq.exec.host" in " ".join(child.cmdline())),
               "client": _cpu_seconds(psutil.Process())}
    warm = min((n for n in rss_at if n >= 1000), default=min(rss_at))
    rss_end = rss_at[done]
    result = {
        "jobs": args.jobs, "prefilled_finished_jobs": args.prefill, "states": states,
        "daemon_options": args.daemon_args,
        "total_seconds": finished - started, "jobs_per_second": args.jobs / (finished - started),
        "jobs_per_second_by_batch": per_batch,
        "daemon_rss_start_mb": rss_start / 2**20,
        "daemon_rss_mb_by_jobs_ended": {n: rss / 2**20 for n, rss in rss_at.items()},
        "warm_after_jobs": warm, "daemon_rss_warm_mb": rss_at[warm] / 2**20,
        "daemon_rss_end_mb": rss_end / 2**20,
        "growth_warm_to_end_mb": (rss_end - rss_at[warm]) / 2**20,
        "cpu_ms_per_job": {who: seconds * 1000 / args.jobs for who, seconds in cpu.items()},
    }
    print(json.dumps(result, indent=2))
    print(f"\n{args.jobs} jobs after {args.prefill} finished ones: {states}; "
          f"{result['jobs_per_second']:.1f} jobs/s (batches {min(per_batch):.0f}-"
          f"{max(per_batch):.0f}); daemon RSS {result['daemon_rss_start_mb']:.1f} MB at start, "
          f"{result['daemon_rss_warm_mb']:.1f} MB after {warm} jobs, "
          f"{result['daemon_rss_end_mb']:.1f} MB after {done} "
          f"({result['growth_warm_to_end_mb']:+.1f} MB between them); CPU per job: "
          + ", ".join(f"{who} {ms:.2f} ms" for who, ms in result["cpu_ms_per_job"].items()))
    if states != {"COMPLETED": args.jobs}:
        sys.exit(1)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    main()

"""Soak: many tiny jobs through the real daemon; throughput and the daemon's memory.

  python bench/soak.py [--jobs 2000]

Submits through gq's real CLI entry point (in this process, so 2,000 interpreter starts do
not dominate) in batches of --batch, waits until each batch ended, and checks that all
COMPLETED. Reports jobs per second (first submit to last end), the daemon's RSS at the
start and after each batch, and its growth between the first batch and the end (the
daemon's memory should stay flat once warm), and the CPU time per job of the daemon, the
hosts and the submitting client (where the time goes). Prints one JSON object, then a summary.
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
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=1000,
                        help="submit this many, wait for them to end, read the RSS; again")
    args = parser.parse_args()
    with Node("--kill-wait", "1") as node:
        os.environ["GQ_HOME"] = node.env["GQ_HOME"]
        os.chdir(node.dir)
        from gq.cli.main import main as gq_main

        script = node.dir / "tiny.sh"
        script.write_text("true\n")
        daemon = psutil.Process(int((node.dir / "home" / "daemon.pid").read_text()))
        rss_start = daemon.memory_info().rss
        started = time.monotonic()
        jobs, rss_at = [], {}  # jobs ended so far -> the daemon's RSS then
        for batch in range(0, args.jobs, args.batch):
            ids = []
            for _ in range(min(args.batch, args.jobs - batch)):
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    if gq_main(["submit", "--parsable", str(script)]) != 0:
                        raise RuntimeError("submit failed")
                ids.append(int(out.getvalue()))
            jobs += node.wait_all(ids, timeout=3600)
            rss_at[len(jobs)] = daemon.memory_info().rss
        finished = time.monotonic()
        cpu = {"daemon": _cpu_seconds(daemon),
               "hosts": sum(_cpu_seconds(child) for child in daemon.children()
                            if "gq.exec.host" in " ".join(child.cmdline())),
               "client": _cpu_seconds(psutil.Process())}
    states = {}
    for job in jobs:
        states[job["state"]] = states.get(job["state"], 0) + 1
    first = next(iter(rss_at))
    rss_end = rss_at[len(jobs)]
    result = {
        "jobs": args.jobs, "states": states, "total_seconds": finished - started,
        "jobs_per_second": args.jobs / (finished - started),
        "daemon_rss_start_mb": rss_start / 2**20,
        "daemon_rss_mb_by_jobs_ended": {n: rss / 2**20 for n, rss in rss_at.items()},
        "daemon_rss_end_mb": rss_end / 2**20,
        "growth_after_first_batch_mb": (rss_end - rss_at[first]) / 2**20,
        "cpu_ms_per_job": {who: seconds * 1000 / args.jobs for who, seconds in cpu.items()},
    }
    print(json.dumps(result, indent=2))
    print(f"\n{args.jobs} jobs: {states}; {result['jobs_per_second']:.1f} jobs/s; daemon RSS "
          f"{result['daemon_rss_start_mb']:.1f} MB at start, {rss_at[first] / 2**20:.1f} MB "
          f"after {first} jobs, {result['daemon_rss_end_mb']:.1f} MB after {len(jobs)} "
          f"({result['growth_after_first_batch_mb']:+.1f} MB between them); CPU per job: "
          + ", ".join(f"{who} {ms:.2f} ms" for who, ms in result["cpu_ms_per_job"].items()))
    if states != {"COMPLETED": args.jobs}:
        sys.exit(1)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    main()

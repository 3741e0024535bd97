"""Overshoot injections: no neighbour is lost to another job's growth.

  python bench/oom.py [--injections 50] [-- DAEMON_OPTIONS]

Two emulated devices with a memory budget (1G each). Each injection is a pair on one
device: a neighbour (a seeded training loop declaring 400M) and a job declaring 300M that
overshoots at its fourth step on its first run, by holding 600M more for real (its cgroup's
limit, or the host's check at the boundary, ends it) or by raising the error CUDA's
allocator raises (the worker reports what it asked for), alternately. Counts the
neighbours that did not complete with the losses of their run alone, the overshooting jobs
that were requeued and completed on their next run, and those that failed; the time from a
requeue to the next start. Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node, percentile  # noqa: E402

LOOP = Path(__file__).resolve().parent / "jobs" / "memory_loop.py"


def _at(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--injections", type=int, default=50)
    parser.add_argument("daemon_args", nargs="*", metavar="-- DAEMON_OPTION")
    args = parser.parse_args()
    alone = json.loads(
        subprocess.run(
            [sys.executable, str(LOOP)], capture_output=True, text=True, check=True
        ).stdout.splitlines()[-1]
    )
    began = time.monotonic()
    with Node(
        "--kill-wait", "1", "--cpu-devices", "2", "--cpu-memory", "2G", *args.daemon_args
    ) as node:
        pairs = []
        for index in range(args.injections):
            neighbour = node.submit("--gpu-mem", "400M", str(LOOP))
            how = "allocate" if index % 2 == 0 else "raise"
            grower = node.submit("--gpu-mem", "300M", str(LOOP), "--grow-mb", "600", "--how", how)
            pairs.append((neighbour, grower, how))
        ids = [job_id for pair in pairs for job_id in pair[:2]]
        jobs = {job["id"]: job for job in node.wait_all(ids, timeout=1800)}
        elapsed = time.monotonic() - began
        lost, requeued, completed, failed, delays = [], 0, 0, [], []
        for neighbour, grower, how in pairs:
            losses = (
                json.loads((node.dir / f"gq-{neighbour}.out").read_text().splitlines()[-1])
                if jobs[neighbour]["state"] == "COMPLETED"
                else None
            )
            if losses != alone:
                lost.append(neighbour)
            shown = json.loads(node.gq("show", "--json", str(grower)))
            requeued += shown["ooms"] >= 1
            if shown["state"] == "COMPLETED":
                completed += 1
            else:
                failed.append((grower, how, shown["reason"]))
            events = shown["events"]
            for back, start in zip(events, events[1:]):
                if (
                    back["new_state"] == "PENDING"
                    and back["old_state"] == "RUNNING"
                    and start["new_state"] == "RUNNING"
                ):
                    delays.append(_at(start["time"]) - _at(back["time"]))
    result = {
        "injections": args.injections,
        "neighbours_lost": len(lost),
        "lost": lost,
        "overshooting_requeued": requeued,
        "overshooting_completed": completed,
        "overshooting_failed": failed,
        "seconds": round(elapsed, 1),
        "requeue_to_restart_p50_s": round(percentile(delays, 50), 3),
        "requeue_to_restart_p90_s": round(percentile(delays, 90), 3),
    }
    print(json.dumps(result))
    print(
        f"{args.injections} overshoot injections in {elapsed:.0f} s: {len(lost)} neighbours "
        f"lost; {requeued} overshooting jobs requeued, {completed} completed on a later run, "
        f"{len(failed)} failed; requeue to restart p50 {result['requeue_to_restart_p50_s']} s, "
        f"p90 {result['requeue_to_restart_p90_s']} s"
    )


if __name__ == "__main__":
    main()

"""Packing benchmark (--lanes auto): do jobs that leave the device idle get more done side
by side, and do jobs that fill it stay taking turns? On the cpu device a lane is a core.

  python bench/packing.py [--steps 1500] [--mb 8]

For each pair of jobs (cores_loop.py: fixed work a step, so a slowed job takes longer):
two single-threaded jobs, and two that each keep every core busy (--threads = the cores),
the makespan of the pair under gq --lanes 1 (taking turns), under gq --lanes auto (no
flag: the default), and as two plain processes started at once without gq; throughput is
the pair's steps over its makespan, and each is given against --lanes 1 in the same run.
Targets: single-threaded, auto >= 1.7x --lanes 1 (and within 10 % of plain processes);
filling, auto within 5 % of --lanes 1 (the packing is tried and undone).
Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402

LOOP = str(Path(__file__).resolve().parent / "jobs" / "cores_loop.py")


def under_gq(lanes: str, job: list[str]) -> tuple[float, list[str]]:
    """The pair's makespan, and what the host decided of its lanes meanwhile (its log)."""
    with Node("--lanes", lanes) as node:
        start = time.monotonic()
        ids = [node.submit(LOOP, *job) for _ in range(2)]
        node.end_states(ids)
        took = time.monotonic() - start
        log = node.dir / "home" / "hosts" / "cpu.log"
        decided = [line.split("INFO ", 1)[-1] for line in log.read_text().splitlines()]
        return took, [line for line in decided if line.startswith("lanes:")]


def plain(job: list[str]) -> float:
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, LOOP, *job]) for _ in range(2)]
    for proc in procs:
        proc.wait()
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--mb", type=int, default=8)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    pairs = {
        "single-threaded": ["--threads", "1"],
        f"filling ({cores} threads)": ["--threads", str(cores)],
    }
    results: dict[str, dict] = {}
    for name, threads in pairs.items():
        job = ["--steps", str(args.steps), "--mb", str(args.mb), *threads]
        (turns, _), (auto, decided), bare = under_gq("1", job), under_gq("auto", job), plain(job)
        results[name] = {
            "auto_decisions": decided,
            "makespan_lanes_1": turns,
            "makespan_auto": auto,
            "makespan_plain": bare,
            "auto_vs_lanes_1": turns / auto,
            "plain_vs_lanes_1": turns / bare,
        }
    single, filling = results["single-threaded"], results[f"filling ({cores} threads)"]
    summary = {
        "single_threaded_auto_vs_lanes_1": single["auto_vs_lanes_1"],
        "single_threaded_target": 1.7,
        "single_threaded_auto_vs_plain": single["auto_vs_lanes_1"] / single["plain_vs_lanes_1"],
        "filling_auto_vs_lanes_1": filling["auto_vs_lanes_1"],
        "filling_target": 0.95,
    }
    print(json.dumps({"cores": cores, "load": os.getloadavg()[0], "pairs": results, **summary}))
    for name, figures in results.items():
        print(
            f"{name}: --lanes 1 {figures['makespan_lanes_1']:.1f} s, auto "
            f"{figures['makespan_auto']:.1f} s ({figures['auto_vs_lanes_1']:.2f}x), plain "
            f"processes {figures['makespan_plain']:.1f} s ({figures['plain_vs_lanes_1']:.2f}x)"
        )
    print(
        f"targets: single-threaded auto {summary['single_threaded_auto_vs_lanes_1']:.2f}x "
        f">= 1.7x; filling auto {summary['filling_auto_vs_lanes_1']:.2f}x >= 0.95x"
    )


if __name__ == "__main__":
    main()

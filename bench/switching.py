"""Switching benchmark: how fast the execution host hands a lane from one job to another,
and what running under gq costs a job per iteration.

  python bench/switching.py [--quick]

- switch latency: two resident jobs in tight loops share one lane under `fair`, so the lane
  alternates between them; a switch is the time from one job's iteration end to the other,
  already waiting, job's iteration start, on the shared monotonic clock: the holder's DONE
  and the next job's GO, through the host. Without gaps the lane may be kept for the job
  that just released it (its gap is anticipated); with 2.5 ms gaps (past the anticipation
  limit) it goes to the job waiting at every release.
- overhead, as a new user meets it (bench/jobs/train_loop.py): a tiny forward, backward and
  optimizer step, then 1 ms or 5 ms of busy host-side work, run bare (python) and under gq
  alternately, medians of 3; overhead = loop time under gq / bare - 1, and the range of
  each gq run against the bare run before it (the machine's noise, often wider than the
  targets). "alone": one job on the node (it runs under a lease: gq.exec.lane.lease); "shared":
  two such jobs at once on one lane under `fair`, each against its bare twin run beside
  the other (they take turns through the host).
  (Under `fifo` the earlier job holds the lane until it ends, even in its gaps, so the
  figure would be the second job's wait, not the cost of sharing.)
- the machine's floor: one process waking another over a socket pair and back (what a
  switch through the host does twice), with the two on
  different CPUs and on one, with no Python of gq's in between.
Prints one JSON object, then a summary with the targets: switch p50 <= 50 us and p99 <=
150 us; overhead <= 0.5 % at 5 ms and <= 2 % at 1 ms, alone and shared.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node, percentile  # noqa: E402

LOOP = str(Path(__file__).resolve().parent / "jobs" / "spin_loop.py")
TRAIN = str(Path(__file__).resolve().parent / "jobs" / "train_loop.py")


def read_runs(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def switch_latencies(runs: list[dict]) -> list[float]:
    """From one job's iteration end to the other's start, where the other had asked for
    the lane before that end (it was waiting)."""
    spans = sorted(
        (begin, end, run["job"], asked) for run in runs for begin, end, asked in run["spans"]
    )
    return [
        nxt[0] - prev[1]
        for prev, nxt in zip(spans, spans[1:])
        if nxt[2] != prev[2] and nxt[3] <= prev[1]
    ]


def measure_switches(
    node: Node, steps: int, iter_ms: float, gap_ms: float = 0.0, out_name: str = "switch.jsonl"
) -> list[float]:
    out = node.dir / out_name
    node.gq("policy", "set", "fair")
    ids = [
        node.submit(LOOP, "--steps", steps, "--iter-ms", iter_ms, "--gap-ms", gap_ms, "--out", out)
        for _ in range(2)
    ]
    node.wait_all(ids)
    runs = read_runs(out)
    # Only the stretch where both jobs were resident and looping counts.
    both_from = max(run["spans"][0][0] for run in runs)
    both_until = min(run["spans"][-1][1] for run in runs)
    for run in runs:
        run["spans"] = [s for s in run["spans"] if both_from <= s[0] and s[1] <= both_until]
    return switch_latencies(runs)


def _loop(iter_ms: float, steps: int, out: Path) -> list[str]:
    return [TRAIN, "--steps", str(steps), "--host-ms", str(iter_ms), "--out", str(out)]


def _loop_seconds(out: Path) -> list[float]:
    return sorted(run["loop_seconds"] for run in read_runs(out))


def measure_overhead(node: Node, iter_ms: float, steps: int, repeats: int, jobs: int) -> dict:
    """``jobs`` copies of the training loop at once, bare and under gq by turns; each run's
    figure is the mean of its jobs' loop times."""
    bare, under = [], []
    node.gq("policy", "set", "fair" if jobs > 1 else "fifo")
    for index in range(repeats):
        bare_out = node.dir / f"bare-{jobs}-{iter_ms}-{index}.jsonl"
        runs = [
            subprocess.Popen([sys.executable, *_loop(iter_ms, steps, bare_out)])
            for _ in range(jobs)
        ]
        if any(run.wait() for run in runs):
            raise RuntimeError("a bare run failed")
        bare.append(statistics.mean(_loop_seconds(bare_out)))
        gq_out = node.dir / f"gq-{jobs}-{iter_ms}-{index}.jsonl"
        node.wait_all(
            [node.submit("--gpu-mem", "1G", *_loop(iter_ms, steps, gq_out)) for _ in range(jobs)]
        )
        under.append(statistics.mean(_loop_seconds(gq_out)))
    bare_s, gq_s = statistics.median(bare), statistics.median(under)
    return {
        "iter_ms": iter_ms,
        "jobs": jobs,
        "steps": steps,
        "bare_seconds": bare_s,
        "gq_seconds": gq_s,
        "overhead": gq_s / bare_s - 1,
        "per_iteration_us": (gq_s - bare_s) / steps * 1e6,
        # each run under gq against the bare run just before it: how far the noise goes
        "pair_overheads": [g / b - 1 for b, g in zip(bare, under)],
    }


def measure_wake_floor(cpus: tuple[int, int], rounds: int = 3000) -> list[float]:
    """Round trips between this process and a child over a socket pair, each pinned to
    one of ``cpus`` (the same CPU twice: no wake-up crosses CPUs)."""
    here, there = socket.socketpair()
    affinity = os.sched_getaffinity(0)
    child = os.fork()
    if child == 0:
        os.sched_setaffinity(0, {cpus[1]})
        for _ in range(rounds):
            there.recv(1)
            there.send(b"x")
        os._exit(0)
    os.sched_setaffinity(0, {cpus[0]})
    trips = []
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            here.send(b"x")
            here.recv(1)
            trips.append(time.perf_counter() - start)
    finally:
        os.sched_setaffinity(0, affinity)
        os.waitpid(child, 0)
        here.close()
        there.close()
    return trips


TARGETS = {1.0: 0.02, 5.0: 0.005}  # overhead at these iteration lengths (ms)


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    cpus = sorted(os.sched_getaffinity(0))
    floors = {"one_cpu": measure_wake_floor((cpus[0], cpus[0]))}
    if len(cpus) > 1:
        floors["two_cpus"] = measure_wake_floor((cpus[0], cpus[1]))
    with Node("--kill-wait", "1", "--lanes", "1") as node:
        latencies = measure_switches(node, int(2000 * scale), 1.0)
        # Gaps past the anticipation limit: no lane is kept for a job in its gap.
        gapped = measure_switches(node, int(800 * scale), 3.0, 2.5, "gapped.jsonl")
        overheads = [
            measure_overhead(node, iter_ms, int(steps * scale), 3, jobs)
            for jobs in (1, 2)
            for iter_ms, steps in ((1.0, 2000), (5.0, 600))
        ]
    result = {
        "switch": {
            "count": len(latencies),
            "p50_us": percentile(latencies, 50) * 1e6,
            "p99_us": percentile(latencies, 99) * 1e6,
            "max_us": max(latencies) * 1e6,
        },
        "switch_with_gaps": {
            "count": len(gapped),
            "p50_us": percentile(gapped, 50) * 1e6,
            "p99_us": percentile(gapped, 99) * 1e6,
        },
        "overhead": overheads,
        "round_trip_floor": {
            where: {"p50_us": percentile(trips, 50) * 1e6, "p99_us": percentile(trips, 99) * 1e6}
            for where, trips in floors.items()
        },
    }
    print(json.dumps(result, indent=2))
    switch = result["switch"]
    print(
        f"\nswitch latency over {switch['count']} switches: p50 {switch['p50_us']:.0f} us "
        f"(target <= 50: {_verdict(switch['p50_us'] <= 50)}), p99 {switch['p99_us']:.0f} us "
        f"(target <= 150: {_verdict(switch['p99_us'] <= 150)})"
    )
    gapped = result["switch_with_gaps"]
    print(
        f"switch latency, 3 ms iterations with 2.5 ms gaps, over "
        f"{gapped['count']} switches: p50 {gapped['p50_us']:.0f} us, p99 "
        f"{gapped['p99_us']:.0f} us"
    )
    for where, floor in result["round_trip_floor"].items():
        print(
            f"round trip between two processes, {where.replace('_', ' ')}: p50 "
            f"{floor['p50_us']:.0f} us, p99 {floor['p99_us']:.0f} us (the floor: a wake-up "
            "is half of one)"
        )
    for row in overheads:
        target = TARGETS[row["iter_ms"]]
        print(
            f"overhead, {'alone' if row['jobs'] == 1 else 'two sharing a lane'}, "
            f"{row['iter_ms']:g} ms of host work an iteration: {100 * row['overhead']:+.2f} % "
            f"({row['per_iteration_us']:.0f} us per iteration; bare {row['bare_seconds']:.3f} s,"
            f" gq {row['gq_seconds']:.3f} s; pairs {100 * min(row['pair_overheads']):+.1f} "
            f"to {100 * max(row['pair_overheads']):+.1f} %; target <= {100 * target:g} %: "
            f"{_verdict(row['overhead'] <= target)})"
        )


if __name__ == "__main__":
    main()

"""gq's fifo on several devices against a strict central FIFO queue.

  python bench/central_fifo.py [--trace T.csv] [--gpus 8] [--jobs 1181 --load 0.9 --seed 1]

Runs ``gq simulate --policy fifo --no-backfill --jobs-csv`` on the trace (moves as the
daemon's default, and off with ``--move-margin 1000000``), reads the per-job CSV, and
compares its mean JCT with a central FIFO queue's (:mod:`gq.sim.central`: a job starts at
the earliest time at or after its arrival and the previous job's start at which its devices
are free). Without ``--trace``: a trace of ``--jobs`` jobs drawn (``--seed``) from the
shipped 60-job Tiresias trace (its GPU counts, 1 to 8, and run times), arriving as a
Poisson process that keeps ``--load`` of the devices busy. Prints one JSON object, then a
summary with the jobs gq ended latest against the central queue.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gq.sim.central import central_fifo  # noqa: E402
from gq.sim.traces import TraceJob, load, write_gq_csv  # noqa: E402

SHIPPED = ROOT / "tests" / "data" / "tiresias-60.csv"
NO_MOVES = 1_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=1181)
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        trace = args.trace
        if trace is None:
            trace = Path(scratch) / "drawn.csv"
            write_gq_csv(drawn(args.jobs, args.gpus, args.load, args.seed), trace)
        jobs = {job.id: job for job in load(trace)}
        reference = central_fifo(list(jobs.values()), args.gpus)
        central = statistics.fmean(end - jobs[i].submit_time for i, (_, end) in reference.items())
        result = {
            "trace": str(
                args.trace
                or f"{args.jobs} jobs drawn from {SHIPPED.name}, load {args.load}, seed {args.seed}"
            ),
            "gpus": args.gpus,
            "central_fifo_mean_jct": central,
        }
        for label, margin in (("moves", None), ("no_moves", NO_MOVES)):
            ends = simulated(trace, args.gpus, margin, Path(scratch) / f"{label}.csv")
            mean = statistics.fmean(end - jobs[i].submit_time for i, end in ends.items())
            later = sorted(((ends[i] - reference[i][1], i) for i in ends), reverse=True)[:5]
            result[label] = {
                "mean_jct": mean,
                "above_central": mean / central - 1,
                "latest": [{"job": i, "seconds": round(by, 1)} for by, i in later],
            }
    print(json.dumps(result, indent=2))
    print()
    print(
        f"{result['trace']} on {args.gpus} devices, no backfill: central FIFO mean JCT "
        f"{central:.1f} s; gq fifo {result['moves']['mean_jct']:.1f} s "
        f"({result['moves']['above_central']:+.2%}), without moves "
        f"{result['no_moves']['mean_jct']:.1f} s ({result['no_moves']['above_central']:+.2%})"
    )


def drawn(count: int, gpus: int, load_share: float, seed: int) -> list[TraceJob]:
    """``count`` jobs drawn from the shipped trace, arriving as a Poisson process at the
    rate that keeps ``load_share`` of ``gpus`` devices busy on average."""
    rng = random.Random(seed)
    pool = load(SHIPPED)
    work = statistics.fmean(min(job.gpus, gpus) * job.duration for job in pool)
    rate = load_share * gpus / work
    jobs, clock = [], 0.0
    for job_id in range(count):
        model = rng.choice(pool)
        clock += rng.expovariate(rate)
        jobs.append(
            TraceJob(job_id, round(clock, 3), model.duration, model.iterations, gpus=model.gpus)
        )
    return jobs


def simulated(trace: Path, gpus: int, margin: int | None, out: Path) -> dict[int, float]:
    """Each job's end as ``gq simulate`` writes it in its per-job CSV."""
    command = [
        sys.executable,
        "-m",
        "gq",
        "simulate",
        "--trace",
        str(trace),
        "--gpus",
        str(gpus),
        "--policy",
        "fifo",
        "--no-backfill",
        "--jobs-csv",
        str(out),
    ]
    if margin is not None:
        command += ["--move-margin", str(margin)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this tree's gq
    subprocess.run(command, env=env, check=True, capture_output=True)
    with open(out, newline="") as handle:
        return {int(row["job_id"]): float(row["end_time"]) for row in csv.DictReader(handle)}


if __name__ == "__main__":
    main()

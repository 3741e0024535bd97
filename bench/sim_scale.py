"""The simulator at trace scale: seconds and peak memory per policy on generated traces.

  python bench/sim_scale.py [--policies fifo,srtf,...] [--timeout 60]

Traces (seeded, so every run sees the same jobs):
  long     80 jobs, 10^8 iterations in all (the longest 11 million), one device
  long-1e6 the same jobs with iterations divided by 100: memory must not follow iterations
  many     10,000 jobs of 10 to 100,000 iterations, on one device and on 8 (a fifth of
           them asking for 2, 4 or 8 devices)
Each policy runs in a process of its own (its peak RSS is its memory), with the
simulator's defaults: exact (turns are settled in closed form).
Targets: long <= 2 s per policy; many <= 20 s per policy on 1 and on 8 devices.
Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gq.sim.traces import TraceJob, write_gq_csv  # noqa: E402

POLICIES = "fifo,srtf,fair,priority,rr,deadline"


def long_trace(total_iterations: int, seed: int = 1) -> list[TraceJob]:
    rng = random.Random(seed)
    weights = [10 ** rng.uniform(0, 3.05) for _ in range(80)]
    scale = total_iterations / sum(weights)
    jobs, clock = [], 0.0
    for index, weight in enumerate(weights):
        iterations = max(1, round(weight * scale))
        step = rng.uniform(0.05, 0.5)
        jobs.append(
            TraceJob(
                id=index,
                submit_time=round(clock, 3),
                duration=iterations * step,
                iterations=iterations,
                priority=rng.randrange(4),
                user=f"user{rng.randrange(8)}",
            )
        )
        clock += rng.expovariate(1.0) * iterations * step * 0.9  # about full load
    return jobs


def many_trace(count: int = 10_000, seed: int = 2) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs, clock = [], 0.0
    for index in range(count):
        iterations = max(10, round(10 ** rng.uniform(1, 5)))
        step = rng.uniform(0.01, 0.5)
        gpus = rng.choices([1, 2, 4, 8], weights=[80, 10, 6, 4])[0]
        jobs.append(
            TraceJob(
                id=index,
                submit_time=round(clock, 3),
                duration=iterations * step,
                iterations=iterations,
                gpus=gpus,
                priority=rng.randrange(4),
                user=f"user{rng.randrange(20)}",
            )
        )
        clock += rng.expovariate(1.0) * 3100.0  # about 0.9 of one device
    return jobs


def one_run(trace: Path, policy: str, gpus: int) -> None:
    """In a child process: simulate, then print seconds and peak RSS as JSON."""
    from gq import policies
    from gq.sim.simulator import simulate
    from gq.sim.traces import load

    jobs = load(trace)
    started = time.perf_counter()
    result = simulate(jobs, policies.make(policy), gpus=gpus)
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "seconds": seconds,
                "stretches": result.events,
                "avg_jct": result.summary()["avg_jct"],
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def measure(trace: Path, policy: str, gpus: int, timeout: float) -> dict:
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(trace), policy, str(gpus)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        ).stdout
    except subprocess.TimeoutExpired:
        return {"seconds": None, "over": timeout}
    return json.loads(out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        one_run(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gq-sim-scale-"))
    traces = {"long": long_trace(10**8), "long-1e6": long_trace(10**6), "many": many_trace()}
    for name, jobs in traces.items():
        write_gq_csv(jobs, work / f"{name}.csv")
    cases = [("long", 1), ("long-1e6", 1), ("many", 1), ("many", 8)]
    rows = []
    for policy in args.policies.split(","):
        for name, gpus in cases:
            row = measure(work / f"{name}.csv", policy, gpus, args.timeout)
            rows.append({"policy": policy, "trace": name, "gpus": gpus, **row})
    result = {
        "traces": {
            name: {"jobs": len(jobs), "iterations": sum(j.iterations for j in jobs)}
            for name, jobs in traces.items()
        },
        "runs": rows,
    }
    print(json.dumps(result, indent=2))
    print("\npolicy     long(1)   long-1e6(1)  many(1)   many(8)    peak RSS long / long-1e6")
    for policy in args.policies.split(","):
        mine = {(r["trace"], r["gpus"]): r for r in rows if r["policy"] == policy}

        def cell(key, mine=mine):
            row = mine[key]
            return (
                f"{row['seconds']:7.2f} s"
                if row["seconds"] is not None
                else f" >{row['over']:.0f} s "
            )

        rss = [mine[k].get("peak_rss_mb") for k in (("long", 1), ("long-1e6", 1))]
        memory = " / ".join(f"{m:.0f} MB" if m else "-" for m in rss)
        print(
            f"{policy:9} {cell(('long', 1))}  {cell(('long-1e6', 1))}  {cell(('many', 1))}"
            f" {cell(('many', 8))}   {memory}"
        )


if __name__ == "__main__":
    main()

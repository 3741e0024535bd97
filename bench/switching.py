"""Switching benchmark: how fast the execution host hands a lane from one job to another,
and what running under gq costs a job per iteration.

  python bench/switching.py [--quick]

- switch latency: two resident jobs in tight loops share one lane under `fair`, so the lane
  alternates between them; a switch is the time from one job's iteration end (its DONE) to
  the other, already READY, job's iteration start (its GO), on the shared monotonic clock.
- overhead: the same loop of 5 ms and 50 ms busy iterations run bare (python) and under gq
  alone on the node; overhead = loop time under gq / bare − 1 (median of repeats).
Prints one JSON object, then a summary. Targets: p99 switch < 1 ms; overhead < 3 % at 50 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node, percentile  # noqa: E402

LOOP = str(Path(__file__).resolve().parent / "jobs" / "spin_loop.py")


def read_runs(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def switch_latencies(runs: list[dict]) -> list[float]:
    spans = sorted((begin, end, run["job"]) for run in runs for begin, end in run["spans"])
    return [nxt[0] - prev[1] for prev, nxt in zip(spans, spans[1:]) if nxt[2] != prev[2]]


def measure_switches(node: Node, steps: int, iter_ms: float) -> list[float]:
    out = node.dir / "switch.jsonl"
    node.gq("policy", "set", "fair")
    ids = [node.submit(LOOP, "--steps", steps, "--iter-ms", iter_ms, "--out", out)
           for _ in range(2)]
    node.wait_all(ids)
    runs = read_runs(out)
    # Only the stretch where both jobs were resident and looping counts.
    both_from = max(run["spans"][0][0] for run in runs)
    both_until = min(run["spans"][-1][1] for run in runs)
    for run in runs:
        run["spans"] = [s for s in run["spans"] if both_from <= s[0] and s[1] <= both_until]
    return switch_latencies(runs)


def measure_overhead(node: Node, iter_ms: float, steps: int, repeats: int) -> dict:
    bare, under = [], []
    node.gq("policy", "set", "fifo")
    for index in range(repeats):
        bare_out = node.dir / f"bare-{iter_ms}-{index}.jsonl"
        subprocess.run([sys.executable, LOOP, "--steps", str(steps), "--iter-ms", str(iter_ms),
                        "--out", str(bare_out)], check=True)
        bare.append(read_runs(bare_out)[0]["loop_seconds"])
        gq_out = node.dir / f"gq-{iter_ms}-{index}.jsonl"
        node.wait_all([node.submit(LOOP, "--steps", steps, "--iter-ms", iter_ms, "--out", gq_out)])
        under.append(read_runs(gq_out)[0]["loop_seconds"])
    bare_s, gq_s = statistics.median(bare), statistics.median(under)
    return {"iter_ms": iter_ms, "steps": steps, "bare_seconds": bare_s, "gq_seconds": gq_s,
            "overhead": gq_s / bare_s - 1, "per_iteration_us": (gq_s - bare_s) / steps * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    with Node("--kill-wait", "1") as node:
        latencies = measure_switches(node, int(2000 * scale), 1.0)
        overheads = [measure_overhead(node, 5.0, int(400 * scale), 3),
                     measure_overhead(node, 50.0, int(60 * scale), 3)]
    result = {
        "switch": {"count": len(latencies), "p50_us": percentile(latencies, 50) * 1e6,
                   "p99_us": percentile(latencies, 99) * 1e6, "max_us": max(latencies) * 1e6},
        "overhead": overheads,
    }
    print(json.dumps(result, indent=2))
    switch = result["switch"]
    print(f"\nswitch latency over {switch['count']} switches: p50 {switch['p50_us']:.0f} us, "
          f"p99 {switch['p99_us']:.0f} us (target < 1000 us)")
    for row in overheads:
        print(f"overhead at {row['iter_ms']:g} ms iterations: {100 * row['overhead']:+.2f} % "
              f"({row['per_iteration_us']:.0f} us per iteration; bare {row['bare_seconds']:.3f} s,"
              f" gq {row['gq_seconds']:.3f} s)")


if __name__ == "__main__":
    main()

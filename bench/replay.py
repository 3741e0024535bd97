"""Replay a scaled slice of a job trace for real through the daemon, beside the simulator.

  python bench/replay.py [--jobs 8] [--total 40] [--policies fifo,srtf] [--plot OUT.png]

Takes the first --jobs jobs of the trace, scales durations and submit times so the jobs
hold --total seconds of device time, turns each into a real small torch training job
(iterations of at least --min-iter-ms; multi-GPU jobs become 1-device jobs on this node)
and submits them through the real CLI at their scaled times on the cpu device, all of them
resident (--max-resident 64), once per policy. Then it asks the simulator what the same
jobs should have done: recorded submit times, measured mean iteration times, and each
job's measured startup (process start to first iteration). Prints JSON, then a summary;
--plot draws the real and the simulated runs side by side (timeline and JCT CDF).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402

from gq import policies  # noqa: E402
from gq.sim.simulator import JobRun, Result, Slice, simulate  # noqa: E402
from gq.sim.traces import TraceJob, load  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JOB = str(Path(__file__).resolve().parents[1] / "examples" / "kernel_train.py")
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "tiresias-60.csv"


def scaled_slice(trace: list[TraceJob], count: int, total: float,
                 min_iter: float) -> list[TraceJob]:
    chosen = sorted(trace, key=lambda j: (j.submit_time, j.id))[:count]
    scale = total / sum(j.duration for j in chosen)
    first = chosen[0].submit_time
    jobs = []
    for job in chosen:
        duration = job.duration * scale
        iterations = max(1, min(job.iterations, int(duration / min_iter)))
        jobs.append(replace(job, submit_time=(job.submit_time - first) * scale,
                            duration=duration, iterations=iterations, gpus=1))
    return jobs


def run_for_real(jobs: list[TraceJob], policy: str) -> list["_Real"]:
    """Run the jobs through the daemon; return them as they really ran."""
    with Node("--kill-wait", "1", "--max-resident", "64") as node:
        node.gq("policy", "set", policy)
        ids: dict[int, int] = {}
        start = time.monotonic()

        spans_file = node.dir / "spans.jsonl"
        for job in jobs:
            time.sleep(max(0.0, start + job.submit_time - time.monotonic()))
            ids[job.id] = node.submit("--steps", job.iterations, JOB, "--steps",
                                      job.iterations, "--iter-ms",
                                      f"{1000 * job.iteration_time:.3f}",
                                      "--spans-out", spans_file)
        infos = {info["id"]: info for info in node.wait_all(list(ids.values()))}
        spans = {int(row["job"]): row["spans"] for row in
                 map(json.loads, spans_file.read_text().splitlines())}
        real = []
        first = min(_ts(info["submit_time"]) for info in infos.values())
        for job in jobs:
            info = infos[ids[job.id]]
            if info["state"] != "COMPLETED":
                raise RuntimeError(f"trace job {job.id} ended {info['state']}: {info['reason']}")
            out = node.dir / f"gq-{info['id']}.out"
            startup = json.loads(out.read_text().strip().splitlines()[-1])["startup"]
            real.append(_Real(job, info, first, startup, spans[info["id"]]))
        return real


class _Real:
    """A job as it really ran: its trace entry for the simulator, its real JCT, and its
    iterations' device-time spans (seconds since the first submit)."""

    def __init__(self, job: TraceJob, info: dict, first: float, startup: float,
                 spans: list[tuple[float, float]]):
        submit = _ts(info["submit_time"]) - first
        self.jct = _ts(info["end_time"]) - _ts(info["submit_time"])
        self.spans = [(begin - first, end - first) for begin, end in spans]
        self.trace = TraceJob(id=job.id, submit_time=submit,
                              duration=info["mean_iteration"] * job.iterations,
                              iterations=job.iterations, startup=startup)


def as_result(policy: str, real: list[_Real]) -> Result:
    """The real run in the simulator's result shape, so the same plots can draw it."""
    runs = []
    for entry in real:
        run = JobRun(entry.trace, 1, devices=(0,))
        run.end = entry.trace.submit_time + entry.jct
        runs.append(run)
    slices = [Slice(0, entry.trace.id, begin, end) for entry in real for begin, end in entry.spans]
    busy = sum(piece.end - piece.start for piece in slices)
    return Result(f"{policy} (real)", runs, slices, busy, gpus=1)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--total", type=float, default=40.0, help="seconds of device time")
    parser.add_argument("--min-iter-ms", type=float, default=20.0)
    parser.add_argument("--policies", default="fifo,srtf")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    jobs = scaled_slice(load(args.trace), args.jobs, args.total, args.min_iter_ms / 1000)
    rows, plotted = [], []
    for name in args.policies.split(","):
        real = run_for_real(jobs, name)
        real_avg = sum(r.jct for r in real) / len(real)
        predicted = simulate([r.trace for r in real], policies.make(name), gpus=1)
        plotted += [as_result(name, real), predicted]
        sim_avg = predicted.summary()["avg_jct"]
        rows.append({"policy": name, "jobs": len(real), "real_avg_jct": real_avg,
                     "sim_avg_jct": sim_avg, "error": real_avg / sim_avg - 1,
                     "mean_startup": sum(r.trace.startup for r in real) / len(real)})
    result = {"trace": str(args.trace), "jobs": len(jobs), "total_device_seconds": args.total,
              "policies": rows}
    by_name = {row["policy"]: row for row in rows}
    if "fifo" in by_name and "srtf" in by_name:
        real_ratio = by_name["fifo"]["real_avg_jct"] / by_name["srtf"]["real_avg_jct"]
        sim_ratio = by_name["fifo"]["sim_avg_jct"] / by_name["srtf"]["sim_avg_jct"]
        result["fifo_over_srtf"] = {"real": real_ratio, "sim": sim_ratio,
                                    "real_vs_sim": real_ratio / sim_ratio}
    print(json.dumps(result, indent=2))
    print(f"\n{len(jobs)} jobs of {args.trace.name}, scaled to {args.total:g} s of device time:")
    for row in rows:
        print(f"  {row['policy']:>8}: real avg JCT {row['real_avg_jct']:.2f} s, simulated "
              f"{row['sim_avg_jct']:.2f} s ({100 * row['error']:+.1f} %; target within 15 %)")
    if "fifo_over_srtf" in result:
        ratio = result["fifo_over_srtf"]
        print(f"  FIFO/SRTF avg JCT: real {ratio['real']:.3f}, simulated {ratio['sim']:.3f} "
              f"(real/sim {ratio['real_vs_sim']:.3f}; target at least 0.9)")
    if args.plot:
        from gq.sim.plot import draw

        draw(plotted, args.plot)


if __name__ == "__main__":
    main()

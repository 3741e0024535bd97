"""Replay a job trace for real through the daemon, beside the simulator.

  python bench/replay.py [--jobs 8] [--total 40] [--policies fifo,srtf] [--plot OUT.png]
  python bench/replay.py --trace bench/traces/fill.csv --as-is \
      --policies fifo,priority:always,priority:gapfit,priority:never

Takes the first --jobs jobs of the trace, scales durations and submit times so the jobs
hold --total seconds of device time (--as-is: the trace unscaled), turns each into a real
small torch training job (iterations of at least --min-iter-ms, the trace's idle gap after
each; multi-GPU jobs become 1-device jobs on this node) and submits them, with their
priorities, through the real CLI at their times on the cpu device, all of them resident
(--max-resident 64), once per policy (``priority:gapfit`` names a fill mode). Then it asks
the simulator what the same jobs should have done: recorded submit times, measured mean
iteration times, gaps and startups (process start to first iteration).

When the trace's jobs differ in priority, it also reports what ``--fill`` is about (after
FIKIT): the highest-priority jobs' JCT, also relative to running alone (one more real run),
and the lower jobs' throughput (iterations per second while the first high job would run
alone: from its first chance to iterate, for as long as it takes alone), also relative to
fifo's. Prints JSON, then a summary; --plot draws the real and the simulated runs side by
side (timeline and JCT CDF).
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
from gq import policies  # noqa: E402
from gq.sim.node import JobRun  # noqa: E402
from gq.sim.results import Result, Slice  # noqa: E402
from gq.sim.simulator import simulate  # noqa: E402
from gq.sim.traces import TraceJob, load  # noqa: E402

from harness import Node  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JOB = str(Path(__file__).resolve().parents[1] / "examples" / "kernel_train.py")
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "tiresias-60.csv"


def scaled_slice(
    trace: list[TraceJob], count: int, total: float, min_iter: float
) -> list[TraceJob]:
    chosen = sorted(trace, key=lambda j: (j.submit_time, j.id))[:count]
    scale = total / sum(j.duration for j in chosen)
    first = chosen[0].submit_time
    jobs = []
    for job in chosen:
        duration = job.duration * scale
        iterations = max(1, min(job.iterations, int(duration / min_iter)))
        jobs.append(
            replace(
                job,
                submit_time=(job.submit_time - first) * scale,
                duration=duration,
                iterations=iterations,
                gpus=1,
            )
        )
    return jobs


def run_for_real(jobs: list[TraceJob], policy: str, fill: str) -> list[_Real]:
    """Run the jobs through the daemon; return them as they really ran."""
    with Node("--kill-wait", "1", "--max-resident", "64") as node:
        node.gq("policy", "set", policy, "--fill", fill)
        ids: dict[int, int] = {}
        start = time.monotonic()
        first_submit = min(job.submit_time for job in jobs)
        spans_file = node.dir / "spans.jsonl"
        for job in sorted(jobs, key=lambda j: (j.submit_time, j.id)):
            time.sleep(max(0.0, start + job.submit_time - first_submit - time.monotonic()))
            ids[job.id] = node.submit(
                "--steps",
                job.iterations,
                "--priority",
                job.priority,
                JOB,
                "--steps",
                job.iterations,
                "--iter-ms",
                f"{1000 * job.iteration_time:.3f}",
                "--gap-ms",
                f"{1000 * job.gap:.3f}",
                "--spans-out",
                spans_file,
            )
        infos = {info["id"]: info for info in node.wait_all(list(ids.values()))}
        spans = {
            int(row["job"]): row["spans"]
            for row in map(json.loads, spans_file.read_text().splitlines())
        }
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
    """A job as it really ran: its trace entry for the simulator (measured iteration time,
    gap and startup), its real JCT, and its iterations' spans (seconds since the first
    submit)."""

    def __init__(
        self,
        job: TraceJob,
        info: dict,
        first: float,
        startup: float,
        spans: list[tuple[float, float]],
    ):
        submit = _ts(info["submit_time"]) - first
        self.jct = _ts(info["end_time"]) - _ts(info["submit_time"])
        self.spans = [(begin - first, end - first) for begin, end in spans]
        # The gap as the host measured it (release to next acquire), where the trace has one.
        self.trace = replace(
            job,
            submit_time=submit,
            startup=startup,
            duration=info["mean_iteration"] * job.iterations,
            gap=(info["mean_gap"] or 0.0) if job.gap else 0.0,
        )


def as_result(policy: str, real: list[_Real]) -> Result:
    """The real run in the simulator's result shape, so the same plots can draw it."""
    runs = []
    for entry in real:
        run = JobRun(entry.trace, 1, lanes=(0,))
        run.end = entry.trace.submit_time + entry.jct
        runs.append(run)
    slices = [Slice(0, entry.trace.id, begin, end) for entry in real for begin, end in entry.spans]
    busy = sum(piece.end - piece.start for piece in slices)
    return Result(f"{policy} (real)", runs, slices, busy, gpus=1)


class Fill:
    """What ``--fill`` trades (after FIKIT), read off one run, real or simulated: the
    highest-priority jobs' mean JCT, and the other jobs' iterations per second over the
    window in which the first high job, from its first chance to iterate, would run alone."""

    def __init__(
        self, jobs: list[TraceJob], jcts: dict[int, float], iteration_ends: dict[int, list[float]]
    ):
        top = max(job.priority for job in jobs)
        high = [job for job in jobs if job.priority == top]
        self.high_jct = sum(jcts[job.id] for job in high) / len(high)
        first = min(high, key=lambda j: (j.submit_time, j.id))
        self.first_high_end = first.submit_time + jcts[first.id]
        begin = first.submit_time + first.startup
        self.window = (begin, begin + first.iterations * (first.iteration_time + first.gap))
        low = [job.id for job in jobs if job.priority < top]
        # When in the window the low jobs' iterations ended (seconds from its start).
        self.low_ends = sorted(
            end - begin
            for job_id in low
            for end in iteration_ends[job_id]
            if self.window[0] <= end <= self.window[1]
        )
        self.low_rate = len(self.low_ends) / (self.window[1] - self.window[0])

    @classmethod
    def of_real(cls, real: list[_Real]) -> Fill:
        return cls(
            [r.trace for r in real],
            {r.trace.id: r.jct for r in real},
            {r.trace.id: [end for _, end in r.spans] for r in real},
        )

    @classmethod
    def of_simulated(cls, jobs: list[TraceJob], result: Result) -> Fill:
        by_id = {job.id: job for job in jobs}
        ends: dict[int, list[float]] = {job.id: [] for job in jobs}
        for piece in result.slices:  # iterations one period apart, each but the last + gap
            job = by_id[piece.job]
            period = job.iteration_time + job.gap
            count = round((piece.end - piece.start + job.gap) / period)
            ends[job.id] += [piece.start + k * period - job.gap for k in range(1, count + 1)]
        return cls(jobs, {run.job.id: run.end - run.job.submit_time for run in result.runs}, ends)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _policy(spec: str) -> tuple[str, str]:
    """``priority:gapfit`` -> (priority, gapfit); a bare name fills always."""
    name, _, fill = spec.partition(":")
    return name, fill or "always"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--total", type=float, default=40.0, help="seconds of device time")
    parser.add_argument("--as-is", action="store_true", help="replay the trace unscaled")
    parser.add_argument("--min-iter-ms", type=float, default=20.0)
    parser.add_argument("--policies", default="fifo,srtf")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    trace = load(args.trace)
    jobs = (
        trace if args.as_is else scaled_slice(trace, args.jobs, args.total, args.min_iter_ms / 1000)
    )
    with_fill = len({job.priority for job in jobs}) > 1
    rows, plotted, fills = [], [], {}
    for spec in args.policies.split(","):
        name, fill = _policy(spec)
        real = run_for_real(jobs, name, fill)
        real_avg = sum(r.jct for r in real) / len(real)
        measured = [r.trace for r in real]
        predicted = simulate(measured, policies.make(name, fill), gpus=1)
        plotted += [as_result(spec, real), predicted]
        sim_avg = predicted.summary()["avg_jct"]
        row = {
            "policy": spec,
            "jobs": len(real),
            "real_avg_jct": real_avg,
            "sim_avg_jct": sim_avg,
            "error": real_avg / sim_avg - 1,
            "mean_startup": sum(r.trace.startup for r in real) / len(real),
        }
        if with_fill:
            fills[spec] = (Fill.of_real(real), Fill.of_simulated(measured, predicted))
            row.update(_fill_row(*fills[spec]))
        rows.append(row)
    result = {
        "trace": str(args.trace),
        "jobs": len(jobs),
        "device_seconds": sum(j.duration for j in jobs),
        "policies": rows,
    }
    by_name = {row["policy"]: row for row in rows}
    if "fifo" in by_name and "srtf" in by_name:
        real_ratio = by_name["fifo"]["real_avg_jct"] / by_name["srtf"]["real_avg_jct"]
        sim_ratio = by_name["fifo"]["sim_avg_jct"] / by_name["srtf"]["sim_avg_jct"]
        result["fifo_over_srtf"] = {
            "real": real_ratio,
            "sim": sim_ratio,
            "real_vs_sim": real_ratio / sim_ratio,
        }
    if with_fill:
        result["alone"] = _alone(jobs)
        _relative(rows, fills, result["alone"])
    print(json.dumps(result, indent=2))
    _summary(args, jobs, result, rows, with_fill)
    if args.plot:
        from gq.sim.plot import draw

        draw(plotted, args.plot)


def _fill_row(real: Fill, sim: Fill) -> dict:
    return {
        "high_jct_real": real.high_jct,
        "high_jct_sim": sim.high_jct,
        "high_jct_error": real.high_jct / sim.high_jct - 1,
        "low_rate_real": real.low_rate,
        "low_rate_sim": sim.low_rate,
        "low_rate_error": real.low_rate / sim.low_rate - 1 if sim.low_rate else None,
        "window_real": real.window,
        "window_sim": sim.window,
        "first_high_end_real": real.first_high_end,
        "first_high_end_sim": sim.first_high_end,
        "low_ends_in_window_real": [round(t, 3) for t in real.low_ends[:40]],
    }


def _alone(jobs: list[TraceJob]) -> dict:
    """The highest-priority jobs run by themselves, for real and simulated."""
    top = max(job.priority for job in jobs)
    high = [job for job in jobs if job.priority == top]
    real = run_for_real(high, "fifo", "always")
    predicted = simulate([r.trace for r in real], policies.make("fifo"), gpus=1)
    return {
        "high_jct_real": sum(r.jct for r in real) / len(real),
        "high_jct_sim": predicted.summary()["avg_jct"],
    }


def _relative(rows: list[dict], fills: dict, alone: dict) -> None:
    """High JCT relative to alone, low throughput relative to fifo's (each side its own)."""
    fifo = fills.get("fifo")
    for row in rows:
        for side in ("real", "sim"):
            row[f"high_vs_alone_{side}"] = row[f"high_jct_{side}"] / alone[f"high_jct_{side}"]
            if fifo is not None:
                base = fifo[0 if side == "real" else 1].low_rate
                row[f"low_vs_fifo_{side}"] = row[f"low_rate_{side}"] / base if base else None


def _summary(args, jobs: list[TraceJob], result: dict, rows: list[dict], with_fill: bool) -> None:
    scale = "as is" if args.as_is else f"scaled to {args.total:g} s of device time"
    print(f"\n{len(jobs)} jobs of {args.trace.name}, {scale}:")
    for row in rows:
        print(
            f"  {row['policy']:>16}: real avg JCT {row['real_avg_jct']:.2f} s, simulated "
            f"{row['sim_avg_jct']:.2f} s ({100 * row['error']:+.1f} %; target within 15 %)"
        )
    if "fifo_over_srtf" in result:
        ratio = result["fifo_over_srtf"]
        print(
            f"  FIFO/SRTF avg JCT: real {ratio['real']:.3f}, simulated {ratio['sim']:.3f} "
            f"(real/sim {ratio['real_vs_sim']:.3f}; target at least 0.9)"
        )
    if not with_fill:
        return
    alone = result["alone"]
    print(
        f"  high-priority JCT alone: real {alone['high_jct_real']:.2f} s, simulated "
        f"{alone['high_jct_sim']:.2f} s"
    )
    print(
        f"  {'policy':>16}  {'high JCT real/sim':>20}  {'vs alone real/sim':>18}  "
        f"{'low it/s real/sim':>18}  {'vs fifo real/sim':>17}"
    )
    for row in rows:
        low_error = row["low_rate_error"]
        print(
            f"  {row['policy']:>16}  {row['high_jct_real']:6.2f}/{row['high_jct_sim']:6.2f} "
            f"({100 * row['high_jct_error']:+5.1f}%)  {row['high_vs_alone_real']:6.2f}x/"
            f"{row['high_vs_alone_sim']:.2f}x  {row['low_rate_real']:6.1f}/"
            f"{row['low_rate_sim']:5.1f} ("
            f"{'  n/a' if low_error is None else f'{100 * low_error:+5.1f}%'})  "
            f"{_ratio(row.get('low_vs_fifo_real'))}/{_ratio(row.get('low_vs_fifo_sim'))}"
        )


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


if __name__ == "__main__":
    main()

"""bench/forecast.py --startup: how well a pending job's end is forecast once the job
before it, of the same script, has been measured (the scenario is described there)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from harness import Node, stamp

ROOT = Path(__file__).resolve().parents[1]
STARTUP_STEPS = (150, 100, 120)


def startup_scenario(kind: str, repeat: int) -> dict:
    """The start-up scenario ``repeat`` times for one kind of script ("steps" or "torch"):
    each pending job's end error over the forecasts made while it was pending, once the
    first job's own pace was measured."""
    runs = []
    for _ in range(repeat):
        node = Node("--cpu-devices", "1", "--max-resident", "1", "--kill-wait", "1")
        node.env["PYTHONPATH"] = str(ROOT)  # this tree's gq, for the daemon and the jobs
        with node:
            node.gq("policy", "set", "fifo")
            extra = ["--no-torch"] if kind == "steps" else []
            ids = [
                node.submit(
                    "-J",
                    f"startup-{kind}",
                    "--gpu-mem",
                    "512M",
                    "--steps",
                    steps,
                    str(ROOT / "examples" / "kernel_train.py"),
                    *extra,
                    "--steps",
                    steps,
                    "--iter-ms",
                    30,
                )
                for steps in STARTUP_STEPS
            ]
            samples: dict[int, list[float | None]] = {job_id: [] for job_id in ids[1:]}
            while True:
                listed = {
                    job["id"]: job
                    for job in json.loads(node.gq("status", "--start", "--json", "--all"))
                }
                if all(listed[job_id]["state"] == "COMPLETED" for job_id in ids):
                    break
                first = listed[ids[0]]
                if (
                    first["state"] == "RUNNING"
                    and (first.get("forecast") or {}).get("basis") == "known"
                ):
                    for job_id in ids[1:]:
                        if listed[job_id]["state"] == "PENDING":
                            samples[job_id].append(stamp(listed[job_id]["forecast"]["end"]))
                time.sleep(0.25)
            ended = {job["id"]: job for job in json.loads(node.gq("history", "--json"))}
        for job_id, ends in samples.items():
            start, end = (stamp(ended[job_id][key]) for key in ("start_time", "end_time"))
            errors = [f_end - end for f_end in ends if f_end is not None]  # > 0: late
            runs.append(
                {
                    "job": job_id,
                    "run": end - start,
                    "samples": len(ends),
                    "unknown": sum(f_end is None for f_end in ends),
                    "error_seconds": errors,
                    "error_share": [error / (end - start) for error in errors],
                }
            )
    shares = [abs(share) for run in runs for share in run["error_share"]]
    seconds = [abs(error) for run in runs for error in run["error_seconds"]]
    return {
        "runs": runs,
        "share_median": statistics.median(shares) if shares else None,
        "share_max": max(shares, default=None),
        "seconds_median": statistics.median(seconds) if seconds else None,
        "seconds_max": max(seconds, default=None),
    }


def report_startup(results: dict[str, dict]) -> None:
    print(json.dumps(results, indent=2))
    print()
    for kind, figures in results.items():
        if figures["share_median"] is None:
            print(f"{kind}: no forecast of a pending job was made once the first was measured")
            continue
        runs = ", ".join(f"{run['run']:.1f}" for run in figures["runs"])
        print(
            f"{kind}: pending jobs' end error against their run time median "
            f"{figures['share_median']:.1%}, worst {figures['share_max']:.1%} "
            f"({figures['seconds_median']:.2f} s, worst {figures['seconds_max']:.2f} s); "
            f"run times {runs} s"
        )

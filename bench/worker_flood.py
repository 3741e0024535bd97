"""What a worker that floods its host costs the job beside it: an honest gq.steps loop
(short iterations) runs alone, then beside a job whose worker writes protocol lines to its
host as fast as it can, on the same device under `fair`; both runs in this process, so the
ratio of the honest job's run time is the figure (1.0: the flood costs it nothing).

  python bench/worker_flood.py [--steps 400] [--iteration-ms 2] [--repeats 3]

Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402

HONEST = """import gq, time
for _ in gq.steps(range({steps}), total={steps}):
    end = time.perf_counter() + {seconds}
    while time.perf_counter() < end:
        pass
"""
# Runs released (never asks for the lane) and writes well-formed lines without pause.
FLOOD = """import os, time
from gq.exec.job import session as job_session
from gq.exec.job import worker_link
line = worker_link.line("progress", steps=1) * 64
sock = job_session.active.channel.sock
while not os.path.exists('stop'):
    sock.sendall(line)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--iteration-ms", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    alone, flooded = [], []
    with Node("--kill-wait", "1") as node:
        node.gq("policy", "set", "fair")
        honest = node.dir / "honest.py"
        honest.write_text(HONEST.format(steps=args.steps, seconds=args.iteration_ms / 1000))
        flood = node.dir / "flood.py"
        flood.write_text(FLOOD)
        for _ in range(args.repeats):
            alone.append(run_time(node, honest))
            (node.dir / "stop").unlink(missing_ok=True)
            flooder = node.submit(str(flood))
            wait_running(node, flooder)
            flooded.append(run_time(node, honest))
            (node.dir / "stop").touch()
            node.wait_all([flooder], timeout=60)
    result = {
        "steps": args.steps,
        "iteration_ms": args.iteration_ms,
        "alone_s": alone,
        "beside_flood_s": flooded,
        "ratio": statistics.median(flooded) / statistics.median(alone),
    }
    print(json.dumps(result, indent=2))
    print(
        f"\nhonest job ({args.steps} x {args.iteration_ms:g} ms): alone "
        f"{statistics.median(alone):.2f} s, beside a flooding worker "
        f"{statistics.median(flooded):.2f} s ({result['ratio']:.2f}x), medians of "
        f"{args.repeats}"
    )


def run_time(node: Node, script: Path) -> float:
    """Seconds from the job's start to its end, as the queue recorded them."""
    job_id = node.submit(str(script))
    (job,) = node.wait_all([job_id], timeout=600)
    if job["state"] != "COMPLETED":
        raise RuntimeError(f"job {job_id} ended {job['state']}")
    return job["run_time"]


def wait_running(node: Node, job_id: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(j["id"] == job_id and j["state"] == "RUNNING" for j in node.jobs()):
            time.sleep(1.0)  # its interpreter up and flooding
            return
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id} did not start")


if __name__ == "__main__":
    main()

"""CLI and admission latency: whole-process times of `gq submit` and `gq status` (median of
10 runs each) and how long a submitted job waits before it starts on an idle node.

  python bench/cli_latency.py [--runs 10]

Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402


def timed(node: Node, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gq", *args], env=node.env, cwd=node.dir, check=True,
                   capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with Node("--kill-wait", "1") as node:
        script = node.dir / "noop.sh"
        script.write_text("true\n")
        timed(node, "status")  # warm the page cache and create the database
        submit_times, status_times, waits = [], [], []
        for _ in range(args.runs):
            submit_times.append(timed(node, "submit", "--parsable", str(script)))
            job_id = max(j["id"] for j in node.jobs())
            info = node.wait_all([job_id])[0]
            waits.append((datetime.fromisoformat(info["start_time"])
                          - datetime.fromisoformat(info["submit_time"])).total_seconds())
            status_times.append(timed(node, "status"))
        bare = [timed(node, "--help") for _ in range(args.runs)]
    result = {
        "runs": args.runs,
        "submit_median_s": statistics.median(submit_times),
        "status_median_s": statistics.median(status_times),
        "help_median_s": statistics.median(bare),
        "start_wait_median_s": statistics.median(waits),
        "start_wait_max_s": max(waits),
    }
    print(json.dumps(result, indent=2))
    print(f"\ngq submit {1000 * result['submit_median_s']:.0f} ms, gq status "
          f"{1000 * result['status_median_s']:.0f} ms, gq --help "
          f"{1000 * result['help_median_s']:.0f} ms (whole process, median of {args.runs}); "
          f"submit-to-start on an idle node: median {1000 * result['start_wait_median_s']:.1f} "
          f"ms, max {1000 * result['start_wait_max_s']:.1f} ms (target < 100 ms)")


if __name__ == "__main__":
    main()

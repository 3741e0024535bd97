"""bench/forecast.py's cost figures: what forecasting a thousand pending jobs costs the
daemon and the CLI (the scenario is described there)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time

from harness import Node


def cost(count: int) -> dict:
    with Node("--kill-wait", "1", "--max-pending", str(count + 10)) as node:
        script = node.dir / "wait.sh"
        script.write_text("sleep 1\n")
        for index in range(count):
            node.submit(
                "--begin",
                "now+1hour",
                "--steps",
                "100",
                "-t",
                "10",
                "-J",
                f"later-{index % 20}",
                str(script),
            )
        time.sleep(3)  # a forecast is made at most once a second

        def timed(*argv: str) -> float:
            began = time.perf_counter()
            subprocess.run(argv, env=node.env, cwd=node.dir, check=True, capture_output=True)
            return time.perf_counter() - began

        runs = {"python": [], "status": [], "status_start": []}
        for _ in range(10):  # interleaved: the machine's noise falls on all three alike
            runs["python"].append(timed(sys.executable, "-c", "pass"))
            runs["status"].append(timed(sys.executable, "-m", "gq", "status"))
            runs["status_start"].append(timed(sys.executable, "-m", "gq", "status", "--start"))
        test_only = [
            timed(
                sys.executable,
                "-m",
                "gq",
                "submit",
                "--test-only",
                "--steps",
                "100",
                "-t",
                "10",
                str(script),
            )
            for _ in range(5)
        ]
        listed = json.loads(node.gq("status", "--start", "--json"))
        log = (node.dir / "home" / "daemon.log").read_text()
    took = [float(m) for m in re.findall(r"forecast of \d+ jobs made in ([\d.]+) s", log)]
    medians = {k: statistics.median(v) * 1000 for k, v in runs.items()}
    return {
        "pending": count,
        "forecast_known": sum(1 for j in listed if (j.get("forecast") or {}).get("end")),
        "python_ms": medians["python"],
        "status_ms": medians["status"],
        "status_start_ms": medians["status_start"],
        "start_vs_status": medians["status_start"] / medians["status"],
        "start_vs_python": medians["status_start"] / medians["python"],
        "test_only_ms": statistics.median(test_only) * 1000,
        "forecast_seconds": took[-3:] if took else "under 0.25 s (not logged)",
    }

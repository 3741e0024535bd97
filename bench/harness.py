"""A throwaway gq node for benchmarks: its own GQ_HOME, a real daemon, the real CLI."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class Node:
    def __init__(self, *daemon_args: str):
        self.dir = Path(tempfile.mkdtemp(prefix="gq-bench-"))
        self.env = dict(os.environ, GQ_HOME=str(self.dir / "home"))
        self.daemon_args = daemon_args

    def gq(self, *args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "gq", *map(str, args)], env=self.env,
                                cwd=self.dir, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"gq {' '.join(map(str, args))}: {result.stderr.strip()}")
        return result.stdout

    def __enter__(self) -> "Node":
        self.gq("daemon", "start", *self.daemon_args)
        return self

    def __exit__(self, *exc) -> None:
        self.gq("daemon", "stop")

    def submit(self, *args: str) -> int:
        return int(self.gq("submit", "--parsable", *args).strip())

    def jobs(self) -> list[dict]:
        return json.loads(self.gq("status", "--all", "--json"))

    def wait_all(self, ids: list[int], timeout: float = 600) -> list[dict]:
        """Wait by reading the queue directly: a CLI process per poll would steal the CPU
        the measured jobs need on a small machine."""
        deadline = time.monotonic() + timeout
        marks = ",".join("?" * len(ids))
        while time.monotonic() < deadline:
            with sqlite3.connect(self.dir / "home" / "gq.db") as db:  # read-only
                active = db.execute(f"SELECT count(*) FROM jobs WHERE id IN ({marks}) AND "
                                    "state IN ('PENDING', 'RUNNING')", ids).fetchone()[0]
            if active == 0:
                jobs = {j["id"]: j for j in self.jobs()}
                return [jobs[i] for i in ids]
            time.sleep(0.25)
        raise TimeoutError(f"jobs {ids} did not finish in {timeout} s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]

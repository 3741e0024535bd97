"""A throwaway gq node for benchmarks: its own GQ_HOME, a real daemon, the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path


class Node:
    def __init__(self, *daemon_args: str):
        self.dir = Path(tempfile.mkdtemp(prefix="gq-bench-"))
        self.env = dict(os.environ, GQ_HOME=str(self.dir / "home"))
        self.daemon_args = daemon_args

    def gq(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "gq", *map(str, args)],
            env=self.env,
            cwd=self.dir,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"gq {' '.join(map(str, args))}: {result.stderr.strip()}")
        return result.stdout

    def __enter__(self) -> Node:
        self.gq("daemon", "start", *self.daemon_args)
        return self

    def __exit__(self, *exc) -> None:
        self.gq("daemon", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def submit(self, *args: str) -> int:
        return int(self.gq("submit", "--parsable", *args).strip())

    def jobs(self) -> list[dict]:
        return json.loads(self.gq("status", "--all", "--limit", "0", "--array-tasks", "--json"))

    def wait_all(self, ids: list[int], timeout: float = 600) -> list[dict]:
        """Wait by reading the queue directly: a CLI process per poll would steal the CPU
        the measured jobs need on a small machine."""
        deadline = time.monotonic() + timeout
        marks = ",".join("?" * len(ids))
        while time.monotonic() < deadline:
            with sqlite3.connect(self.dir / "home" / "gq.db") as db:  # read-only
                active = db.execute(
                    f"SELECT count(*) FROM jobs WHERE id IN ({marks}) AND "
                    "state IN ('PENDING', 'RUNNING')",
                    ids,
                ).fetchone()[0]
            if active == 0:
                jobs = {j["id"]: j for j in self.jobs()}
                return [jobs[i] for i in ids]
            time.sleep(0.25)
        raise TimeoutError(f"jobs {ids} did not finish in {timeout} s")

    def array_task_ids(self, array_id: int) -> list[int]:
        """The job ids of an array's tasks, read from the queue (read-only)."""
        with sqlite3.connect(self.dir / "home" / "gq.db") as db:
            return [
                row[0]
                for row in db.execute(
                    "SELECT id FROM jobs WHERE array_job_id = ? ORDER BY id", (array_id,)
                )
            ]

    def prefill(self, job_id: int, count: int) -> None:
        """``count`` finished copies of job ``job_id`` (once it has ended), written to the
        queue behind the daemon's back, as a month of use leaves it."""
        self.end_states([job_id])
        db = sqlite3.connect(self.dir / "home" / "gq.db", timeout=60)
        names = ", ".join(
            f'"{row[1]}"' for row in db.execute("PRAGMA table_info(jobs)") if row[1] != "id"
        )
        db.execute(
            f"INSERT INTO jobs ({names}) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
            f"SELECT i + 1 FROM n WHERE i < ?) SELECT {names} FROM jobs, n "
            "WHERE jobs.id = ?",
            (count, job_id),
        )
        db.commit()
        db.close()

    def progress(self, job_id: int) -> tuple[str, int] | None:
        """The job's state and the steps gq has counted of it, read from the queue
        (read-only); None before it is there."""
        with sqlite3.connect(self.dir / "home" / "gq.db") as db:
            row = db.execute("SELECT state, steps_done FROM jobs WHERE id = ?", (job_id,))
            found = row.fetchone()
        return None if found is None else (found[0], found[1] or 0)

    def ended(self, ids: list[int]) -> int:
        """How many of ``ids`` have ended, read from the queue (read-only)."""
        with sqlite3.connect(self.dir / "home" / "gq.db") as db:
            return db.execute(
                f"SELECT count(*) FROM jobs WHERE id BETWEEN ? AND ? AND id IN "
                f"({','.join('?' * len(ids))}) AND state NOT IN ('PENDING', 'RUNNING')",
                [min(ids), max(ids), *ids],
            ).fetchone()[0]

    def end_states(self, ids: list[int], timeout: float = 600) -> dict[str, int]:
        """Wait as :meth:`wait_all` does, and count the end states by reading the queue (no
        listing through the daemon, which would cost it what is measured)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with sqlite3.connect(self.dir / "home" / "gq.db") as db:  # read-only
                states = dict(
                    db.execute(
                        f"SELECT state, count(*) FROM jobs WHERE id BETWEEN ? AND ? AND id IN "
                        f"({','.join('?' * len(ids))}) GROUP BY state",
                        [min(ids), max(ids), *ids],
                    )
                )
            if not {"PENDING", "RUNNING"} & set(states):
                return states
            time.sleep(0.1)
        raise TimeoutError(f"jobs {ids[0]}..{ids[-1]} did not finish in {timeout} s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def stamp(text: str | None) -> float | None:
    """An ISO time of gq's JSON as a Unix time (None stays None)."""
    return None if text is None else datetime.fromisoformat(text).timestamp()

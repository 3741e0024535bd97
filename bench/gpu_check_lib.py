"""Helpers of bench/gpu_check.py: interval arithmetic on the jobs' device intervals, figures
with thresholds, time-boxed phases that start bare processes and gq jobs and clean up after
themselves, a utilization sampler, and the summary table."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "DEADLINE"}


# ----- intervals: lists of [start_ns, end_ns] ------------------------------------------------
def merge(intervals, lo=-math.inf, hi=math.inf):
    """The union of ``intervals`` clipped to [lo, hi], sorted and disjoint."""
    out = []
    for s, e in sorted(intervals):
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(intervals) -> float:
    return float(sum(e - s for s, e in intervals))


def busy_many(groups, lo=-math.inf, hi=math.inf) -> tuple[float, float]:
    """(time at least two groups were busy, time any was) within [lo, hi]."""
    points = []
    for group in groups:
        for s, e in merge(group, lo, hi):
            points += [(s, 1), (e, -1)]
    points.sort(key=lambda p: (p[0], p[1]))
    both = union = 0.0
    depth, last = 0, None
    for t, step in points:
        if last is not None:
            union += (t - last) if depth >= 1 else 0
            both += (t - last) if depth >= 2 else 0
        depth += step
        last = t
    return both, union


def overlap(groups, lo=-math.inf, hi=math.inf) -> float:
    """Time where two or more groups' intervals intersect / their union, within [lo, hi]."""
    both, union = busy_many(groups, lo, hi)
    return both / union if union else math.nan


def window(runs) -> tuple[float, float]:
    """Where every run's timed loop was going: the latest first timed start to the
    earliest last end."""
    return (max(r["iv"][r["warm"]][0] for r in runs), min(r["iv"][-1][1] for r in runs))


def timed(run):
    return run["iv"][run["warm"] :]


def mean_interval_ms(run) -> float:
    """Device time an iteration: a graph job's iteration is two intervals (its pieces)."""
    spans = timed(run)
    return length(spans) * run.get("pieces", 1) / len(spans) / 1e6 if spans else math.nan


# ----- figures ----------------------------------------------------------------------------
def figure(name, value, op=None, bound=None, note=None, status=None) -> dict:
    """A figure with its threshold: op '>=' or '<=' with a number, 'in' with (lo, hi), or
    none (INFO); ``status`` overrides what they make."""
    kept = status
    if op is None:
        status, threshold = "INFO", ""
    elif not isinstance(value, (int, float)) or value is None or math.isnan(value):
        status, threshold = "N/A", _threshold(op, bound)
    else:
        ok = (
            value >= bound
            if op == ">="
            else value <= bound
            if op == "<="
            else bound[0] <= value <= bound[1]
        )
        status, threshold = ("PASS" if ok else "FAIL"), _threshold(op, bound)
    if isinstance(value, float) and math.isnan(value):
        value = None
    return {
        "name": name,
        "value": value,
        "threshold": threshold,
        "status": kept or status,
        **({"note": note} if note else {}),
    }


def _threshold(op, bound) -> str:
    return f"in [{bound[0]:g}, {bound[1]:g}]" if op == "in" else f"{op} {bound:g}"


class PhaseTimeout(Exception):
    pass


class JobFailed(Exception):
    pass


# ----- the node and the phases' jobs -------------------------------------------------------
class CheckNode(Node):
    """bench/harness.py's Node, with every CLI call bounded in time."""

    def gq(self, *args: str, timeout: float = 60) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "gq", *map(str, args)],
            env=self.env,
            cwd=self.dir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"gq {' '.join(map(str, args))}: {result.stderr.strip()}")
        return result.stdout


class Phase:
    """One phase's jobs: bare processes and gq jobs, each named by a label, each writing
    DIR/LABEL.json; every wait stops at the phase's deadline (PhaseTimeout)."""

    def __init__(
        self, name: str, node: CheckNode, out: Path, budget: float, job: str, gq_options: list[str]
    ):
        self.name, self.node, self.job, self.gq_options = name, node, job, gq_options
        self.dir = out / "jobs" / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + budget
        self.procs: dict[str, subprocess.Popen] = {}
        self.ids: dict[str, int] = {}
        self.figures: list[dict] = []
        self.details: dict = {"timeline": []}
        self._t0 = time.monotonic()

    def note(self, what: str) -> None:
        """The phase's timeline (seconds since its start), for reading where time went."""
        self.details["timeline"].append((round(time.monotonic() - self._t0, 3), what))

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def fig(self, *args, **kwargs) -> None:
        self.figures.append(figure(*args, **kwargs))

    def path(self, label: str) -> Path:
        return self.dir / f"{label}.json"

    def start_file(self, stage: str) -> str:
        return str(self.dir / f"start-{stage}")

    def go(self, stage: str) -> None:
        Path(self.start_file(stage)).touch()
        self.note(f"go {stage}")

    def _args(self, label, args, stage, stop):
        extra = ["--out", str(self.path(label))]
        extra += ["--start-file", self.start_file(stage)] if stage else []
        extra += ["--stop-file", self.start_file(stop)] if stop else []
        return [*map(str, args), *extra]

    def bare(self, label: str, args, stage=None, stop=None, env=None) -> None:
        log = open(self.dir / f"{label}.log", "w")
        self.procs[label] = subprocess.Popen(
            [sys.executable, self.job, *self._args(label, args, stage, stop)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, **(env or {})),
        )
        log.close()
        self.note(f"started {label}")

    def submit(self, label: str, args, stage=None, stop=None, options=(), script=None) -> int:
        argv = [
            "submit",
            "--parsable",
            "-J",
            label,
            "-o",
            str(self.dir / f"{label}-%j.out"),
            *self.gq_options,
            *map(str, options),
            script or self.job,
        ]
        if script:  # a shell job: its first argument is the job script
            argv.append(self.job)
        self.ids[label] = int(self.node.gq(*argv, *self._args(label, args, stage, stop)).strip())
        self.note(f"submitted {label} as job {self.ids[label]}")
        return self.ids[label]

    def _check_alive(self, labels, result=".ready") -> None:
        """Fail at once where a process or job ended without leaving what is waited for."""
        for label in labels:
            proc = self.procs.get(label)
            if proc is not None and proc.poll() is not None and not self._has(label, result):
                raise JobFailed(f"{label} exited {proc.returncode}: {self._tail(label)}")
        if any(label in self.ids for label in labels):
            jobs = {j["id"]: j for j in self.node.jobs()}
            for label in labels:
                job = jobs.get(self.ids.get(label))
                if job and job["state"] in ENDED and not self._has(label, result):
                    raise JobFailed(
                        f"{label} (job {job['id']}) {job['state']} "
                        f"({job['reason']}): {self._tail(label)}"
                    )

    def _has(self, label, result) -> bool:
        return Path(f"{self.path(label)}{result}").exists()

    def _tail(self, label) -> str:
        logs = sorted(self.dir.glob(f"{label}.log")) + sorted(self.dir.glob(f"{label}-*.out"))
        text = logs[0].read_text(errors="replace") if logs else ""
        return " | ".join(text.strip().splitlines()[-3:])

    def wait_ready(self, labels) -> None:
        checked = time.monotonic()
        while not all(Path(f"{self.path(label)}.ready").exists() for label in labels):
            if self.left() <= 0:
                raise PhaseTimeout(f"waiting for {labels} to be ready")
            if time.monotonic() - checked > 1.0:
                self._check_alive(labels)
                checked = time.monotonic()
            time.sleep(0.02)
        self.note(f"ready {' '.join(labels)}")

    def wait_done(self, labels) -> dict[str, dict]:
        """Each label's result, once its process or job has ended."""
        checked = time.monotonic()
        while True:
            if all(self.path(label).exists() for label in labels):
                break
            if self.left() <= 0:
                raise PhaseTimeout(f"waiting for {labels} to end")
            if time.monotonic() - checked > 1.0:
                self._check_alive(labels, "")
                checked = time.monotonic()
            time.sleep(0.05)
        for label in labels:  # written: the process ends next
            if label in self.procs:
                self.procs[label].wait(max(1.0, self.left()))
        self.note(f"done {' '.join(labels)}")
        return {label: json.loads(self.path(label).read_text()) for label in labels}

    def run_stage(self, stage: str, labels) -> dict[str, dict]:
        self.go(stage)
        return self.wait_done(labels)

    def gq_jobs(self, labels) -> dict[str, dict]:
        """gq's view of each labelled job once it has ended (gq status --json)."""
        ids = [self.ids[label] for label in labels]
        jobs = self.node.wait_all(ids, timeout=max(5.0, self.left()))
        self.note(f"ended in gq {' '.join(labels)}")
        return dict(zip(labels, jobs))

    def cleanup(self) -> list[str]:
        """End what this phase started and left running; say what that was."""
        ended = []
        for label, proc in self.procs.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                ended.append(f"killed bare {label}")
        if self.ids:
            try:
                active = [
                    j["id"]
                    for j in self.node.jobs()
                    if j["id"] in self.ids.values() and j["state"] not in ENDED
                ]
                if active:
                    self.node.gq("cancel", *active)
                    self.node.wait_all(active, timeout=30)
                    ended += [f"cancelled job {i}" for i in active]
            except Exception as error:  # noqa: BLE001 - report, go on to the next phase
                ended.append(f"cancel failed: {error}")
        return ended


# ----- utilization -------------------------------------------------------------------------
class Sampler(threading.Thread):
    """The device's utilization every 100 ms (NVML's GPU utilization; psutil's CPU percent on
    the CPU), as (monotonic_ns, percent)."""

    def __init__(self, cuda: bool):
        super().__init__(daemon=True)
        self.samples: list[tuple[int, float]] = []
        self.source = None
        self._stop = threading.Event()
        if cuda:
            try:
                import pynvml

                pynvml.nvmlInit()
                handle = pynvml.nvmlDeviceGetHandleByIndex(0)
                self.read = lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                self.source = "nvml"
            except Exception:  # noqa: BLE001 - no NVML: no utilization figures
                self.read = None
        else:
            import psutil

            psutil.cpu_percent()
            self.read, self.source = psutil.cpu_percent, "psutil"

    def run(self) -> None:
        while self.read and not self._stop.wait(0.1):
            self.samples.append((time.monotonic_ns(), self.read()))

    def stop(self) -> None:
        self._stop.set()

    def mean(self, lo, hi) -> float:
        values = [v for t, v in self.samples if lo <= t <= hi]
        return sum(values) / len(values) if values else math.nan


# ----- the summary ---------------------------------------------------------------------------
def summary(phases: dict) -> str:
    rows = [("phase", "figure", "value", "threshold", "status")]
    for name, phase in phases.items():
        rows.append((name, "(phase)", f"{phase['seconds']:.1f} s", "", phase["status"]))
        for f in phase["figures"]:
            value = f["value"]
            text = (
                f"{value:.4g}" if isinstance(value, float) else "-" if value is None else str(value)
            )
            rows.append(
                (
                    "",
                    f["name"],
                    text[: 70 if f["name"] == "phase" else 40],
                    f["threshold"],
                    f["status"],
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    counts = {}
    for phase in phases.values():
        for f in phase["figures"]:
            counts[f["status"]] = counts.get(f["status"], 0) + 1
    lines.append("  ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def mps_controls(home: Path) -> list[int]:
    """The nvidia-cuda-mps-control processes serving a pipe under ``home`` (gq's --mps puts
    each device's in HOME/mps/DEVICE/pipe): none may outlive a ``gq daemon stop``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(a.endswith(b"nvidia-cuda-mps-control") for a in argv[:2]):
                continue  # (the program, or the script an interpreter runs)
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        pipe = next((v for v in environ if v.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")), b"")
        if pipe.split(b"=", 1)[-1].startswith(str(home / "mps").encode()):
            found.append(int(entry.name))
    return found


def mib(value) -> float | None:
    return None if value is None else value / 2**20


def its(run) -> float | None:
    return run.get("its")


def ratio(a, b) -> float | None:
    return a / b if a is not None and b else None

"""Forecast accuracy and cost: a real queue, forecast while it runs, against what happened.

  python bench/forecast.py [--jobs 16] [--policies fifo,fair] [--pending 1000]
  python bench/forecast.py --startup [--repeat 3]

Start-up (``--startup``, no root needed): three jobs of one script (150, 100 and 120 steps
of 30 ms, ``--steps`` given) under fifo on one device that keeps one job resident, so the
second and third wait pending; the first runs alone, and once its pace is measured the
pending ones' forecast ends are compared with their real ones: the error as a share of
each one's run time (start to end), and in seconds, for the gq.steps loop
(``examples/kernel_train.py --no-torch``) and for the PyTorch one (whose start-up imports
torch). Medians and worst over the forecasts made while they were pending, each run
``--repeat`` times.

Accuracy: a system daemon (run as root) with two emulated devices of two resident jobs
each, and three submitters:
root (PyTorch loops, examples/kernel_train.py) and two throwaway users made for the run
(gq.steps loops, bench/jobs/sleep_loop.py, from a venv of Debian's python3 every user can
run). Jobs of a few paces arrive every 2.5 s; some give --steps, some -t (twice their run
alone, and 20 s),
some neither, under each policy in turn. Every 2 s root reads `gq status --start --json`.
Once all have ended, each forecast is compared with what happened: the start error as a
share of the job's wait (forecasts made while it was pending, waits of a second or more),
the end error as a share of the job's wait and run (submit to end), and in seconds;
medians and p90s, at submit (the first forecast after it) and over every sample, for the
jobs that gave --steps or -t and for the others; how often a forecast was unknown; and
whether any forecast end was off by more than the job's time limit (and, for a pending
job, whether a job submitted after that forecast started before it: a later arrival that
the fair policy puts first is something no forecast can know).

Cost: a personal daemon holding --pending jobs that may start in an hour (--begin), all
forecast; `gq status --start` against `gq status` and `python -c pass` (medians of 10, in
one run), `gq submit --test-only` (median of 5: it waits for the next forecast), and what
the daemon's forecast child took (its log).

Prints one JSON object, then a summary. Needs root (useradd, runuser).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forecast_cost import cost  # noqa: E402
from forecast_startup import report_startup, startup_scenario  # noqa: E402

from harness import percentile, stamp  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class Submitter:
    name: str  # a user name, or "root"
    workdir: Path
    python: str  # the interpreter its jobs and its CLI run with
    kind: str  # "torch" or "steps"


@dataclass
class Spec:
    who: Submitter
    name: str
    steps: int
    iter_ms: float
    give_steps: bool
    give_limit: bool
    job_id: int = 0
    samples: list[tuple[float, str, float | None, float | None, str]] = field(
        default_factory=list
    )  # (when, state, start, end, basis)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--policies", default="fifo,fair")
    parser.add_argument("--pending", type=int, default=1000)
    parser.add_argument(
        "--startup", action="store_true", help="only the start-up scenario (no root needed)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.startup:
        report_startup({kind: startup_scenario(kind, args.repeat) for kind in ("steps", "torch")})
        return
    if os.geteuid() != 0:
        sys.exit("bench/forecast.py needs root: it makes throwaway users")
    result = {"accuracy": {}, "cost": cost(args.pending) if args.pending else None}
    base = Path(tempfile.mkdtemp(prefix="gq-forecast-"))
    base.chmod(0o755)
    users: list[str] = []
    try:
        venv, source = shared_install(base)
        submitters = [Submitter("root", base / "root", sys.executable, "torch")]
        submitters[0].workdir.mkdir()
        for short in ("ann", "bob"):
            name = f"gqf{short}{uuid.uuid4().hex[:5]}"
            subprocess.run(
                ["useradd", "-M", "-d", str(base / name), "-s", "/bin/sh", name], check=True
            )
            users.append(name)
            entry = pwd.getpwnam(name)
            (base / name).mkdir(mode=0o755)
            os.chown(base / name, entry.pw_uid, entry.pw_gid)
            submitters.append(Submitter(name, base / name, venv, "steps"))
        for policy in args.policies.split(","):
            result["accuracy"][policy] = accuracy(base, source, submitters, policy, args.jobs)
    finally:
        for name in users:
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result, indent=2))
    print()
    for policy, figures in result["accuracy"].items():
        given, other = figures["steps_or_limit"], figures["neither"]
        print(
            f"{policy}: {figures['jobs']} jobs; with --steps or -t: end error median "
            f"{given['end_share_median']:.1%} / p90 {given['end_share_p90']:.1%} of wait+run "
            f"({given['end_seconds_median']:.1f} s / {given['end_seconds_p90']:.1f} s), "
            f"against run time median {given['end_run_share_median']:.1%} / p90 "
            f"{given['end_run_share_p90']:.1%}, "
            f"start error median {given['start_share_median']:.1%} / p90 "
            f"{given['start_share_p90']:.1%} of wait; at submit: end median "
            f"{given['at_submit_end_share_median']:.1%}; unknown {given['unknown_share']:.0%}"
            f"; others: end median {other['end_share_median']:.1%}, unknown "
            f"{other['unknown_share']:.0%}; forecasts off by more than the time limit: "
            f"{figures['beyond_time_limit']['running']} of running jobs, "
            f"{figures['beyond_time_limit']['pending']} of pending ones "
            f"({figures['beyond_time_limit']['pending_overtaken_later']} of them overtaken "
            "by a job submitted after the forecast)"
        )
    c = result["cost"]
    if c is None:
        return
    print(
        f"{c['pending']} pending jobs: gq status --start {c['status_start_ms']:.0f} ms, "
        f"gq status {c['status_ms']:.0f} ms, python -c pass {c['python_ms']:.0f} ms "
        f"({c['start_vs_status']:.2f}x status); gq submit --test-only "
        f"{c['test_only_ms']:.0f} ms; the daemon's forecast took {c['forecast_seconds']} s "
        "(in its child, off the loop)"
    )


# ----- accuracy -------------------------------------------------------------------------
def accuracy(
    base: Path, source: Path, submitters: list[Submitter], policy: str, count: int
) -> dict:
    home = base / f"system-{policy}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GQ_")}
    env.update(GQ_SYSTEM_HOME=str(home), PYTHONPATH=str(source))

    def gq(who: Submitter | None, *argv: str) -> str:
        command = [who.python if who else sys.executable, "-m", "gq", *map(str, argv)]
        if who is not None and who.name != "root":
            command = [
                "runuser",
                "-u",
                who.name,
                "--",
                "env",
                *[f"{k}={v}" for k, v in env.items()],
                *command,
            ]
        done = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            cwd=who.workdir if who else base,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"gq {' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    gq(
        None,
        "daemon",
        "start",
        "--system",
        "--cpu-devices",
        "2",
        "--max-resident",
        "2",
        "--kill-wait",
        "1",
    )
    try:
        gq(None, "policy", "set", policy)
        specs = workload(submitters, count)
        next_submit = time.monotonic()
        pending = list(specs)
        live: dict[int, Spec] = {}
        while pending or live:
            now = time.monotonic()
            if pending and now >= next_submit:
                spec = pending.pop(0)
                spec.job_id = int(gq(spec.who, "submit", "--parsable", *command(spec)))
                live[spec.job_id] = spec
                next_submit = now + 2.5
            listed = json.loads(gq(None, "status", "--start", "--json"))
            seen = time.time()
            states = {job["id"]: job for job in listed}
            for job_id in list(live):
                job = states.get(job_id)
                if job is None:
                    del live[job_id]  # ended
                    continue
                made = job.get("forecast") or {}
                live[job_id].samples.append(
                    (
                        seen,
                        job["state"],
                        stamp(made.get("start")),
                        stamp(made.get("end")),
                        made.get("basis", "?"),
                    )
                )
            time.sleep(max(0.0, 2.0 - (time.monotonic() - now)))
        ended = {job["id"]: job for job in json.loads(gq(None, "history", "--json"))}
    finally:
        gq(None, "daemon", "stop")
    return errors(specs, ended)


def workload(submitters: list[Submitter], count: int) -> list[Spec]:
    """Jobs in a fixed order: paces and lengths by submitter, --steps for half, -t for a
    quarter, neither for the rest; names repeat, so later jobs have earlier runs to go on."""
    kinds = [(True, False), (False, True), (True, True), (False, False)]
    specs = []
    for index in range(count):
        who = submitters[index % len(submitters)]
        give_steps, give_limit = kinds[(index // len(submitters)) % len(kinds)]
        iter_ms = {"torch": 100.0, "steps": 80.0}[who.kind] + 40 * (index % 2)
        steps = 100 + 50 * (index % 3)
        name = f"{who.kind}-{int(iter_ms)}ms-{steps}"
        specs.append(Spec(who, name, steps, iter_ms, give_steps, give_limit))
    return specs


def command(spec: Spec) -> list[str]:
    run_seconds = spec.steps * spec.iter_ms / 1000
    options = ["-J", spec.name]
    if spec.give_steps:
        options += ["--steps", str(spec.steps)]
    if spec.give_limit:  # twice as long as it runs alone, and 20 s for its start-up
        limit = round(2 * run_seconds + 20)
        options += ["-t", f"{limit // 60}:{limit % 60:02d}"]
    if spec.who.kind == "torch":
        return [
            *options,
            str(ROOT / "examples" / "kernel_train.py"),
            "--steps",
            str(spec.steps),
            "--iter-ms",
            str(spec.iter_ms),
        ]
    return [
        *options,
        "--python",
        spec.who.python,
        str(ROOT / "bench" / "jobs" / "sleep_loop.py"),
        str(spec.steps),
        str(spec.iter_ms),
    ]


def errors(specs: list[Spec], ended: dict[int, dict]) -> dict:
    groups: dict[str, dict[str, list[float]]] = {}
    # Forecast ends off by more than the time limit; of a pending job's, those where a job
    # submitted after the forecast started before it (no forecast can know of that job).
    beyond = {"running": 0, "pending": 0, "pending_overtaken_later": 0}
    starts = [
        (stamp(ended[s.job_id]["submit_time"]), stamp(ended[s.job_id]["start_time"])) for s in specs
    ]
    for spec in specs:
        job = ended[spec.job_id]
        submitted, start, end = (stamp(job[k]) for k in ("submit_time", "start_time", "end_time"))
        group = groups.setdefault(
            "steps_or_limit" if spec.give_steps or spec.give_limit else "neither",
            {
                k: []
                for k in (
                    "start_share",
                    "end_share",
                    "end_run_share",
                    "end_seconds",
                    "at_submit_end_share",
                    "unknown",
                )
            },
        )
        wait, whole = start - submitted, end - submitted
        for index, (when, state, f_start, f_end, _basis) in enumerate(spec.samples):
            group["unknown"].append(1.0 if f_end is None else 0.0)
            if state == "PENDING" and f_start is not None and wait >= 1.0:
                group["start_share"].append(abs(f_start - start) / wait)
            if f_end is None:
                continue
            group["end_share"].append(abs(f_end - end) / whole)
            group["end_run_share"].append(abs(f_end - end) / (end - start))
            group["end_seconds"].append(abs(f_end - end))
            if index == 0:
                group["at_submit_end_share"].append(abs(f_end - end) / whole)
            if job["time_limit"] and abs(f_end - end) > job["time_limit"]:
                beyond["pending" if state == "PENDING" else "running"] += 1
                if state == "PENDING" and any(
                    later_submit > when and later_start < start
                    for later_submit, later_start in starts
                ):
                    beyond["pending_overtaken_later"] += 1
    summary: dict = {
        "jobs": len(specs),
        "beyond_time_limit": beyond,
        "states": sorted({ended[s.job_id]["state"] for s in specs}),
        "per_job": [_detail(spec, ended[spec.job_id]) for spec in specs],
    }
    for name, figures in groups.items():
        summary[name] = {
            "samples": len(figures["unknown"]),
            "unknown_share": statistics.fmean(figures["unknown"] or [0.0]),
        }
        for key in (
            "start_share",
            "end_share",
            "end_run_share",
            "end_seconds",
            "at_submit_end_share",
        ):
            values = figures[key] or [float("nan")]
            summary[name][f"{key}_median"] = statistics.median(values)
            summary[name][f"{key}_p90"] = percentile(values, 90)
    for name in ("steps_or_limit", "neither"):
        summary.setdefault(
            name,
            {
                "samples": 0,
                "unknown_share": float("nan"),
                **{
                    f"{key}_{q}": float("nan")
                    for key in (
                        "start_share",
                        "end_share",
                        "end_run_share",
                        "end_seconds",
                        "at_submit_end_share",
                    )
                    for q in ("median", "p90")
                },
            },
        )
    return summary


def _detail(spec: Spec, job: dict) -> dict:
    """One job: what it gave, when it ran, and each forecast's errors in seconds."""
    submitted, start, end = (stamp(job[k]) for k in ("submit_time", "start_time", "end_time"))
    return {
        "id": spec.job_id,
        "user": spec.who.name,
        "name": spec.name,
        "gave": ("steps " if spec.give_steps else "") + ("limit" if spec.give_limit else ""),
        "wait": round(start - submitted, 2),
        "run": round(end - start, 2),
        "samples": [
            (
                round(when - submitted, 1),
                state[:2],
                basis,
                None if f_start is None else round(f_start - start, 2),
                None if f_end is None else round(f_end - end, 2),
            )
            for when, state, f_start, f_end, basis in spec.samples
        ],
    }


def shared_install(base: Path) -> tuple[str, Path]:
    """A venv of Debian's python3 with gq's dependencies but torch (kept between runs, as the
    tests keep theirs), and a copy of gq's source every user can read."""
    with open(ROOT / "pyproject.toml", "rb") as handle:
        needs = [
            d for d in tomllib.load(handle)["project"]["dependencies"] if not d.startswith("torch")
        ]
    venv = Path(
        f"/tmp/gq-test-venv-{hashlib.sha256(chr(10).join(needs).encode()).hexdigest()[:12]}"
    )
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import typer, sqlalchemy, alembic, psutil"]
    if not python.exists() or subprocess.run(probe, capture_output=True).returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *needs], check=True)
    source = base / "src"
    for part in ("gq", "migrations"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for directory, _, files in os.walk(source):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    return str(python), source


if __name__ == "__main__":
    main()

"""One prepared check of gq on a GPU node: does a lane mean the device?

  python3 bench/gpu_check.py [--cpu] [--quick] [--out DIR] [--budget SECONDS]

Starts a personal gq daemon in a throwaway GQ_HOME (as bench/harness.py's Node does: one lane
per device, up to 8 resident jobs), runs the phases below with the job kinds of
bench/gpu_jobs/job.py (plain PyTorch loops that note each iteration's device interval on the
common monotonic clock: CUDA timing events, or monotonic_ns around CPU work), writes
DIR/gpu_check.json and prints a summary table last: each figure, its threshold, and
PASS/FAIL/INFO. Each phase is time-boxed: one that overruns is reported as TIMEOUT, what
it left running is ended, and the next phase starts.

- environment: versions, GPU, driver, compute mode, and one process's CUDA context beyond
  what PyTorch's allocator reserved (NVML's figure for the process minus memory_reserved).
- alone: each kind (spin, matmul, launch, graph) bare and under gq alone: throughput ratio.
- fair_pair: two spin jobs on one lane under fair, started together: overlap of their
  device intervals, each one's device share (event truth), gq's attained time against it,
  and the stretch of a kernel against alone.
- hand_over: two spin jobs of one user under fair on one lane: the device's idle time
  between their iterations (<= 5 %) and their overlap (0), by their CUDA events on the
  common clock, with the gaps at hand-overs; and a holder killed just after its release, its
  tail on the device: its successor goes on (bench/gpu_check_handover.py).
- priority_fill: priority --fill gapfit, a high-priority spin job with host gaps and two
  low-priority ones: the high job's throughput against alone, overlap, and the same three
  as bare processes at once ("plain sharing": the high job's loop time there against gq's).
- sweep: 8 small training jobs packed under fair against one at a time (fifo): makespan
  (first iteration to last) and mean utilization (bench/gpu_check_sharing.py, as packing).
- packing: the sweep's jobs under fair with --lanes 1, with --lanes auto (the driver
  time-slices lanes side by side) and, on a GPU, with --lanes auto --mps (NVIDIA's MPS runs
  them truly at once; the daemon started again each way): makespans, their ratios (>= 1.0
  on a GPU), utilization, gq info's MPS line, and no MPS control daemon left after the
  daemon stops. Not in the cpu device's quick run (CI's), where bench/packing.py measures it.
- escapes: a shell job (no lane) beside a lane job, and a CUDA-graph job (replay outside
  any module call) beside a spin job under fair: overlap of each pair
  (bench/gpu_check_bounds.py, as bounded_hold).
- checkpoint: gq suspend moves a job's device memory to host memory and back (1, 8 and
  40 GB), and a high job preempts a low one's memory under priority: the moves' times,
  NVML before, during and after, losses bit for bit (bench/gpu_check_checkpoint.py).
- bounded_hold: a job whose every iteration is far longer than --max-hold beside a job of
  short ones under fair: how often the long job's lane was taken, the short job's
  throughput beside it against alone, and the overlap (on a GPU the frozen job's queued
  kernel drains while the next holder runs: INFO).
- lone_tail: a job alone on its lane (leased, one iteration ahead of its device at most),
  then a second: how long the second waits for the first's tail, against the first's
  device time an iteration (bench/gpu_check_lone.py).

Each phase's jobs, iterations and time budget are in bench/gpu_check_config.py.
--cpu runs the same phases on gq's cpu device (-G 0), kernels as CPU busy work and tiny
models; --quick runs fewer iterations (with --cpu, alone runs spin only and the
phases after fair_pair use torch-free jobs marked with gq.steps, so that it ends in about
30 s on 2 cores: the CI smoke test; importing torch costs a job about 2 s of CPU there).
Exit status 0 once it ran (FAILs are findings); 1 when no daemon could be started, 2 when
interrupted (SIGTERM, ^C: what it started is ended, the results so far written), 3 when a
phase broke on an error of the check's own.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_bounds import bounded_hold, escapes  # noqa: E402
from gpu_check_checkpoint import checkpoint  # noqa: E402
from gpu_check_config import JOB, PROBE, State, config  # noqa: E402
from gpu_check_handover import hand_over  # noqa: E402
from gpu_check_lone import lone_tail  # noqa: E402
from gpu_check_sharing import packing, sweep  # noqa: E402

from gpu_check_lib import (  # noqa: E402
    CheckNode,
    JobFailed,
    Phase,
    PhaseTimeout,
    Sampler,
    its,
    length,
    mean_interval_ms,
    merge,
    mib,
    overlap,
    ratio,
    summary,
    timed,
    window,
)


# ----- phases ------------------------------------------------------------------------------
def environment(ph: Phase, s: State) -> None:
    info = json.loads(s.node.gq("info", "--json"))
    devices = info.get("devices", [])
    ph.details["gq_devices"] = [
        {k: d.get(k) for k in ("name", "kind", "model", "memory_total")} for d in devices
    ]
    ph.fig("gq_devices", ",".join(str(d.get("name")) for d in devices))
    ph.fig("python", platform.python_version())
    ph.fig("cpus", len(os.sched_getaffinity(0)))
    if s.cpu:
        try:
            ph.fig("torch", importlib.metadata.version("torch"))
        except importlib.metadata.PackageNotFoundError:
            ph.fig("torch", None, note="not installed: torch jobs will fail")
        ph.fig("cuda_context_MiB", None, note="--cpu: no CUDA context")
        return
    gpus = [d["name"] for d in devices if d.get("kind") == "cuda"]
    ph.fig("gq_cuda_devices", len(gpus), ">=", 1)
    if gpus:
        s.place = ["-w", gpus[0]]
        ph.fig("jobs_pinned_to", gpus[0])
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,compute_mode", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except OSError as error:
        smi = f"{error},,"
    fields = [f.strip() for f in (smi.splitlines() or [",,"])[0].split(",")]
    for name, value in zip(("gpu", "driver", "compute_mode"), fields):
        ph.fig(name, value)
    probe = subprocess.run(
        [sys.executable, PROBE],
        capture_output=True,
        text=True,
        timeout=max(5.0, ph.left()),
        check=False,
    )
    if probe.returncode != 0:
        raise JobFailed(f"env_probe: {probe.stderr.strip()[-300:]}")
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    ph.details["probe"] = found
    ph.fig("torch", found["torch"])
    ph.fig("torch_cuda", found["cuda"])
    ph.fig(
        "cuda_context_MiB",
        mib(found.get("context_bytes")),
        note="NVML's used memory of the process minus torch.cuda.memory_reserved()",
    )
    ph.fig(
        "cuda_context_by_delta_MiB",
        mib(found.get("context_bytes_by_delta")),
        note="device used memory after minus before, minus memory_reserved()",
    )


def alone(ph: Phase, s: State) -> None:
    for kind in s.cfg["kinds"]:
        bare_l, gq_l = f"{kind}-bare", f"{kind}-gq"
        args = s.args(kind, s.cfg["iters"][kind])
        try:
            ph.bare(bare_l, args, stage=bare_l, env={"CUDA_VISIBLE_DEVICES": ""} if s.cpu else None)
            ph.submit(gq_l, args, stage=gq_l, options=s.mem(kind))
            ph.wait_ready([bare_l, gq_l])
            bare = ph.run_stage(bare_l, [bare_l])[bare_l]
            under = ph.run_stage(gq_l, [gq_l])[gq_l]
            job = ph.gq_jobs([gq_l])[gq_l]  # ended: the next kind's job is alone
        except JobFailed as error:
            ph.fig(f"{kind}_throughput_gq/bare", None, note=str(error)[:300], status="FAIL")
            ph.details[f"{kind}_error"] = [str(error), *ph.cleanup()]  # the next kind alone
            continue
        s.alone[kind] = {"bare": bare, "gq": under}
        strict = kind in ("spin", "matmul")
        ph.fig(
            f"{kind}_throughput_gq/bare",
            ratio(its(under), its(bare)),
            ">=" if strict else None,
            0.95 if strict else None,
        )
        truth = length(merge(under["iv"])) / 1e9
        ph.fig(f"{kind}_gq_attained/truth", ratio(job.get("attained"), truth))
        ph.details[kind] = {
            "bare_its": its(bare),
            "gq_its": its(under),
            "bare_mean_ms": mean_interval_ms(bare),
            "gq_mean_ms": mean_interval_ms(under),
            "gq_attained": job.get("attained"),
            "truth_s": truth,
            "gq_mean_iteration": job.get("mean_iteration"),
        }


def fair_pair(ph: Phase, s: State) -> None:
    s.node.gq("policy", "set", "fair")
    labels = ["A", "B"]
    for label in labels:
        ph.submit(label, s.args("spin", s.cfg["fair_iters"]), stage="go", options=s.mem("spin"))
    ph.wait_ready(labels)
    runs = ph.run_stage("go", labels)
    jobs = ph.gq_jobs(labels)
    lo, hi = window(runs.values())
    ph.details["window_s"] = (hi - lo) / 1e9
    ph.fig(
        "one_device",
        int(jobs["A"].get("device") == jobs["B"].get("device")),
        ">=",
        1,
        note=f"{jobs['A'].get('device')} / {jobs['B'].get('device')}",
    )
    ph.fig("overlap", overlap([timed(runs[label]) for label in labels], lo, hi), "<=", 0.01)
    busy = {label: length(merge(runs[label]["iv"], lo, hi)) for label in labels}
    truth = {label: length(merge(runs[label]["iv"])) / 1e9 for label in labels}
    attained = {label: jobs[label].get("attained") or 0.0 for label in labels}
    for label in labels:
        ph.fig(f"share_{label}", ratio(busy[label], sum(busy.values())), "in", (0.45, 0.55))
    for label in labels:
        ph.fig(f"gq_attained/truth_{label}", ratio(attained[label], truth[label]), "in", (0.9, 1.1))
    ph.fig(
        "gq_share/truth_share_A",
        ratio(ratio(attained["A"], sum(attained.values())), ratio(truth["A"], sum(truth.values()))),
        "in",
        (0.9, 1.1),
    )
    for label in labels:
        ph.fig(f"gq_lane_share_{label}", jobs[label].get("lane_share"))
    pair_ms = mean_interval_ms({"warm": 0, "iv": timed(runs["A"]) + timed(runs["B"])})
    base = s.alone.get("spin", {}).get("bare")
    ph.fig(
        "stretch_vs_alone",
        ratio(pair_ms, mean_interval_ms(base) if base else None),
        note="mean interval in the pair / bare alone",
    )
    ph.details.update(
        its={label: its(runs[label]) for label in labels}, truth_s=truth, attained_s=attained
    )


def priority_fill(ph: Phase, s: State) -> None:
    s.node.gq("policy", "set", "priority", "--fill", "gapfit")
    plain = "priority_fill" in s.cfg["plain"]
    high = s.args("spin", s.cfg["high_iters"], gap=s.cfg["high_gap_ms"], plain=plain)
    low = s.args("spin", 20000, ms=s.cfg["low_ms"], plain=plain)
    bare_env = {"CUDA_VISIBLE_DEVICES": ""} if s.cpu else None
    lows, plain_lows = ["low1", "low2"], ["plain-low1", "plain-low2"]
    ph.bare("alone", high, stage="alone", env=bare_env)
    ph.submit("high", high, stage="gq", options=[*s.mem("spin"), "--priority", 10])
    for label in lows:
        ph.submit(label, low, stage="gq", stop="gq-stop", options=[*s.mem("spin"), "--priority", 0])
    ph.bare("plain-high", high, stage="plain", env=bare_env)
    for label in plain_lows:
        ph.bare(label, low, stage="plain", stop="plain-stop", env=bare_env)
    ph.wait_ready(["alone", "high", *lows, "plain-high", *plain_lows])
    alone_run = ph.run_stage("alone", ["alone"])["alone"]
    ph.go("gq")
    high_run = ph.wait_done(["high"])["high"]
    ph.go("gq-stop")
    low_runs = ph.wait_done(lows)
    jobs = ph.gq_jobs(["high", *lows])
    ph.go("plain")
    plain_high = ph.wait_done(["plain-high"])["plain-high"]
    ph.go("plain-stop")
    plain_low_runs = ph.wait_done(plain_lows)
    ph.fig("high_throughput_gq/alone", ratio(its(high_run), its(alone_run)), ">=", 0.9)
    for label in lows:
        ph.fig(f"{label}_its", its(low_runs[label]))
    lo, hi = high_run["iv"][high_run["warm"]][0], high_run["iv"][-1][1]
    low_iv = [iv for r in low_runs.values() for iv in r["iv"]]
    ph.fig("overlap_high_lows", overlap([timed(high_run), low_iv], lo, hi), "<=", 0.01)
    ph.fig("overlap_any_two", overlap([r["iv"] for r in (high_run, *low_runs.values())], lo, hi))
    ph.fig(
        "high_jct_plain/gq",
        ratio(plain_high["wall_s"], high_run["wall_s"]),
        note="high job's loop time with 2 bare lows at once / under gq; FIKIT: 1.32-16.41x",
    )
    plain_low_iv = [iv for r in plain_low_runs.values() for iv in r["iv"]]
    ph.fig(
        "plain_overlap_high_lows",
        overlap(
            [timed(plain_high), plain_low_iv],
            plain_high["iv"][plain_high["warm"]][0],
            plain_high["iv"][-1][1],
        ),
    )
    ph.details.update(
        alone_its=its(alone_run),
        high_its=its(high_run),
        plain_high_its=its(plain_high),
        plain_low_its={label: its(r) for label, r in plain_low_runs.items()},
        gq={
            label: {
                k: j.get(k)
                for k in (
                    "attained",
                    "mean_iteration",
                    "mean_gap",
                    "iterations_per_second",
                    "lane_share",
                )
            }
            for label, j in jobs.items()
        },
    )


PHASES = {
    "environment": environment,
    "alone": alone,
    "fair_pair": fair_pair,
    "hand_over": hand_over,
    "priority_fill": priority_fill,
    "sweep": sweep,
    "packing": packing,
    "escapes": escapes,
    "bounded_hold": bounded_hold,
    "lone_tail": lone_tail,
    "checkpoint": checkpoint,
}


def run_phase(name, fn, s: State, out: Path, deadline: float) -> dict:
    started = time.monotonic()
    budget = min(s.cfg["budgets"][name], deadline - started)
    ph = Phase(name, s.node, out, max(budget, 0.0), JOB, s.place)
    status, error, ended = "ok", None, []
    try:
        if budget < 5:
            raise PhaseTimeout("no time left in the check's budget")
        fn(ph, s)
    except (PhaseTimeout, TimeoutError, subprocess.TimeoutExpired) as e:
        status, error = "TIMEOUT", f"{type(e).__name__}: {e}"
    except (JobFailed, RuntimeError) as e:  # a job failed, or gq refused: a finding
        status, error = "FAIL", f"{type(e).__name__}: {e}"
    except Exception:  # noqa: BLE001 - the check's own fault: reported, exit 3
        status, error = "ERROR", traceback.format_exc()
    finally:  # also when interrupted (SIGTERM, ^C): nothing of the phase is left running
        ended = ph.cleanup()
    if error:
        ph.fig("phase", error.strip().splitlines()[-1][:300], status=status)
    return {
        "status": status,
        "seconds": time.monotonic() - started,
        "budget": budget,
        "error": error,
        "ended": ended,
        "figures": ph.figures,
        "details": ph.details,
    }


def write(out: Path, result: dict, started: float) -> None:
    result["seconds"] = time.monotonic() - started
    (out / "gpu_check.json.tmp").write_text(json.dumps(result, indent=1, default=str))
    (out / "gpu_check.json.tmp").replace(out / "gpu_check.json")


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="gq's cpu device, CPU kernels")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--out", help="folder for gpu_check.json [a new temporary one]")
    parser.add_argument("--budget", type=float, help="seconds for all phases [by mode]")
    parser.add_argument("--phases", help="a comma-separated list of the phases to run [all]")
    parser.add_argument(
        "--checkpoint",
        choices=("auto", "fake"),
        default="auto",
        help="the daemon's --checkpoint (fake: the checkpoint phase on the cpu device)",
    )
    args = parser.parse_args()
    chosen = args.phases.split(",") if args.phases else list(PHASES)
    unknown = sorted(set(chosen) - set(PHASES))
    if unknown:
        parser.error(f"no phase {', '.join(unknown)}; the phases: {', '.join(PHASES)}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gq-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"gq GPU check ({'cpu' if args.cpu else 'cuda'}{', quick' if args.quick else ''}): "
        f"results in {out}",
        flush=True,
    )
    cfg = config(args.cpu, args.quick)
    started = time.monotonic()
    deadline = started + (args.budget or cfg["total"])
    result = {
        "mode": {"cpu": args.cpu, "quick": args.quick},
        "config": cfg,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "phases": {},
    }
    signal.signal(signal.SIGTERM, _interrupt)
    sampler = Sampler(cuda=not args.cpu)
    sampler.start()
    code = 0
    try:
        with CheckNode(
            "--kill-wait",
            "1",
            "--max-resident",
            "8",
            "--lanes",
            "1",
            "--checkpoint",
            args.checkpoint,
        ) as node:
            node.env["GQ_CHECK_PYTHON"] = sys.executable
            state = State(args.cpu, cfg, node, sampler, fake=args.checkpoint == "fake")
            for name, fn in PHASES.items():
                if name not in chosen or (name in cfg["skip"] and not args.phases):
                    continue
                try:
                    phase = run_phase(name, fn, state, out, deadline)
                except KeyboardInterrupt as stop:
                    result["interrupted"] = f"in {name}: {stop}"
                    print(
                        f"interrupted in {name}: the daemon is stopped, results so far kept",
                        file=sys.stderr,
                    )
                    code = 2
                    break
                result["phases"][name] = phase
                write(out, result, started)  # after each phase: a run killed keeps them
                marks = " ".join(
                    f"{f['name']}={f['status']}"
                    for f in phase["figures"]
                    if f["status"] not in ("INFO",)
                )
                print(f"[{name}] {phase['status']} in {phase['seconds']:.1f} s {marks}", flush=True)
                if phase["status"] == "ERROR":
                    print(phase["error"], file=sys.stderr)
                    code = 3
    except Exception:  # noqa: BLE001 - no daemon: nothing could run
        result["error"] = traceback.format_exc()
        print(result["error"], file=sys.stderr)
        code = code or 1
    sampler.stop()
    result["sampler"] = sampler.source
    write(out, result, started)
    print(f"\nwrote {out / 'gpu_check.json'} in {result['seconds']:.0f} s\n")
    print(summary(result["phases"]))
    return code


if __name__ == "__main__":
    sys.exit(main())

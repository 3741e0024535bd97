"""The GPU check's checkpoint phase (bench/gpu_check.py): gq suspend moves a job's device
memory to host memory through the CUDA driver's checkpoint API and gq resume brings it
back (gq.exec.host.memory_moves).

- For jobs holding each of cfg["checkpoint"]["sizes_mb"] (1, 8 and 40 GB on a GPU), a
  suspend once the job has run a few iterations, then a resume: the move out and back as
  gq's host timed them, NVML's figure for the job's process before, while suspended (it
  leaves the device: 0) and after, and whether its losses and its held block's checksum
  are those of a run never suspended, bit for bit.
- Priority: under `priority`, a low job whose declared memory leaves no room for a high
  one of the same size; the high one submitted: seconds until it runs (the low one is
  preempted, its memory moved out), and whether the low one then completes with the
  losses of a run never preempted.

On the cpu device (--cpu) it runs only with the daemon's --checkpoint fake (the check's
--checkpoint fake): the moves are the fake's, the figures the flow's, NVML's none.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpu_check_lib import Phase, PhaseTimeout

HOLD = str(Path(__file__).resolve().parent / "gpu_jobs" / "hold_train.py")


def checkpoint(ph: Phase, s) -> None:
    cfg = s.cfg["checkpoint"]
    if s.cpu and not s.fake_checkpoints:
        ph.fig("checkpoint", None, note="the cpu device holds no device memory to move")
        return
    ph.job = HOLD

    def args(mb: int, iters: int, mark_at: int) -> list:
        return [
            *("--device", "cpu" if s.cpu else "cuda", "--hold-mb", mb, "--iters", iters),
            *("--mark-at", mark_at, "--step-ms", cfg["step_ms"]),
        ]

    def memory(mb: int) -> list:
        return ["--gpu-mem", f"{cfg['slack_mb'] + mb}M"]

    iters, mark_at = cfg["iters"], cfg["mark_at"]
    ph.submit(
        "reference",
        args(cfg["sizes_mb"][0], iters, -1),
        "reference",
        options=memory(cfg["sizes_mb"][0]),
    )
    ph.wait_ready(["reference"])
    reference = ph.run_stage("reference", ["reference"])["reference"]
    for mb in cfg["sizes_mb"]:
        label = f"hold-{mb}M"
        job_id = ph.submit(label, args(mb, iters, mark_at), label, options=memory(mb))
        out, back, nvml = _round_trip(ph, s, label, job_id)
        run = ph.wait_done([label])[label]
        ph.fig(f"{label}_out_s", out.get("took"), note=out.get("held_why"))
        ph.fig(f"{label}_in_s", back.get("took"))
        ph.fig(f"{label}_nvml_before_MiB", nvml[0])
        ph.fig(f"{label}_nvml_suspended_MiB", nvml[1], *(() if s.cpu else ("<=", 0)))
        ph.fig(f"{label}_nvml_after_MiB", nvml[2])
        ph.fig(f"{label}_losses_equal", float(run["losses"] == reference["losses"]), ">=", 1)
        ph.fig(
            f"{label}_held_block_equal",
            float(run["checksum_after"] == run["checksum_before"]),
            ">=",
            1,
        )
    _priority(ph, s, args, reference)


def _round_trip(ph: Phase, s, label: str, job_id: int) -> tuple[dict, dict, list]:
    """Once the job has marked its iteration: suspended until its memory is in host memory,
    resumed until it is back; what gq said of each move, and NVML before, between, after."""
    ph.wait_ready([label])
    ph.go(label)
    _until(ph, lambda: Path(f"{ph.path(label)}.marked").exists(), f"{label} marked")
    pid = _shown(s, job_id)["pid"]
    nvml = [_nvml_mib(s, pid)]
    s.node.gq("suspend", job_id)
    out = _until(ph, lambda: _moved(s, job_id, "host"), f"{label} in host memory")
    nvml.append(_nvml_mib(s, pid))
    s.node.gq("resume", job_id)
    back = out  # memory held on the device: nothing comes back
    if not out.get("held_why"):
        back = _until(ph, lambda: _moved(s, job_id, "device"), f"{label} back")
    nvml.append(_nvml_mib(s, pid))
    return out, back, nvml


def _priority(ph: Phase, s, args: Callable, reference: dict) -> None:
    cfg = s.cfg["checkpoint"]
    info = json.loads(s.node.gq("info", "--json"))
    total = next(d for d in info["devices"] if d["name"] in _where(s, info))["memory_total"]
    declared = ["--gpu-mem", f"{int(total * 0.6) >> 20}M"]  # two do not fit at once
    s.node.gq("policy", "set", "priority")
    try:
        low = ph.submit(
            "low",
            args(cfg["sizes_mb"][0], cfg["iters"], cfg["mark_at"]),
            "low",
            options=[*declared, "--priority", 0],
        )
        ph.wait_ready(["low"])
        ph.go("low")
        _until(ph, lambda: Path(f"{ph.path('low')}.marked").exists(), "low marked")
        submitted = time.monotonic()
        high = ph.submit(
            "high",
            args(cfg["sizes_mb"][0], cfg["iters"], -1),
            None,
            options=[*declared, "--priority", 10],
        )
        preempted = _until(ph, lambda: _shown(s, low)["preempted"], "the low job preempted")
        _until(ph, lambda: _shown(s, high)["state"] != "PENDING", "the high job started")
        ph.fig("high_start_after_submit_s", time.monotonic() - submitted, "<=", 30)
        ph.fig("low_preempted", float(bool(preempted)), ">=", 1)
        runs = ph.wait_done(["high", "low"])
        ph.fig("low_losses_equal", float(runs["low"]["losses"] == reference["losses"]), ">=", 1)
        ph.details["priority"] = {"low": low, "high": high, "low_shown": _shown(s, low)}
    finally:
        s.node.gq("policy", "set", "fair")


def _where(s, info: dict) -> set[str]:
    """The device the check's jobs run on (-w NAME, or gq's cpu device)."""
    return {s.place[1]} if s.place[0] == "-w" else {d["name"] for d in info["devices"]}


def _shown(s, job_id: int) -> dict:
    shown = json.loads(s.node.gq("show", "--json", job_id))
    return shown[0] if isinstance(shown, list) else shown


def _moved(s, job_id: int, place: str) -> dict | None:
    """The job's device memory once it is at ``place`` (moved, or held: then its reason)."""
    memory = _shown(s, job_id)["device_memory"]
    if memory.get("held_why"):
        return memory
    return memory if memory["place"] == place and memory.get("took") is not None else None


def _until(ph: Phase, found: Callable, what: str):
    while True:
        value = found()
        if value:
            ph.note(what)
            return value
        if ph.left() <= 0:
            raise PhaseTimeout(f"waiting for {what}")
        time.sleep(0.05)


def _nvml_mib(s, pid: int) -> float | None:
    """What NVML says the process holds on the GPU (0: it is not there); None on the cpu."""
    if s.cpu:
        return None
    listed = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    for line in listed.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return float(fields[1])
    return 0.0

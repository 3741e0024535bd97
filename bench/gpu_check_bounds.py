"""The GPU check's phases of work a lane might not hold (bench/gpu_check.py): a shell job and
a replayed CUDA graph beside lane jobs, and an iteration far longer than --max-hold beside
short ones."""

from __future__ import annotations

import math

from gpu_check_config import SHELL_JOB, State

from gpu_check_lib import Phase, its, mean_interval_ms, overlap, ratio, timed, window


def escapes(ph: Phase, s: State) -> None:
    """Work that gq finds no iteration in. A shell job asking for a GPU has the device alone
    (gq cannot put its kernels in a lane), so its lane job starts once it has ended: on a GPU
    the two never overlap. A CUDA graph replayed outside any module call is still in a lane.
    One pair at a time: the second pair waits behind the shell job anyway."""
    s.node.gq("policy", "set", "fair")
    plain = "escapes" in s.cfg["plain"]
    spin = s.args("spin", s.cfg["escape_iters"], plain=plain)
    graph = s.args("graph", s.cfg["escape_iters"], plain=plain)
    for stage, pair, name in (
        ("a", {"shell": (spin, SHELL_JOB), "lane-a": (spin, None)}, "shell_job_overlap"),
        ("b", {"graph": (graph, None), "lane-b": (spin, None)}, "graph_job_overlap"),
    ):
        for label, (args, script) in pair.items():
            kind = "graph" if label == "graph" else "spin"
            ph.submit(label, args, stage=stage, options=s.mem(kind), script=script)
        first = list(pair)[:1] if stage == "a" and s.cuda else list(pair)
        ph.wait_ready(first)
        runs = ph.run_stage(stage, list(pair))
        ph.gq_jobs(list(pair))
        # On a GPU the shell job and its lane job run one after the other: their whole runs.
        alone = stage == "a" and s.cuda
        lo, hi = (-math.inf, math.inf) if alone else window(runs.values())
        # On gq's cpu device a shell job shares it (no device to have alone): INFO there.
        checked = s.cuda or stage == "b"
        ph.fig(
            name,
            overlap([timed(r) for r in runs.values()], lo, hi),
            "<=" if checked else None,
            0.01 if checked else None,
        )
        ph.details[stage] = {
            label: {"its": its(r), "mean_ms": mean_interval_ms(r)} for label, r in runs.items()
        }


def bounded_hold(ph: Phase, s: State) -> None:
    """Nothing holds the device past the bound while another job waits: a job whose every
    iteration lasts hog_ms beside one of spin_ms iterations, under fair with --max-hold."""
    s.node.gq("policy", "set", "fair", "--max-hold", s.cfg["max_hold"])
    try:
        plain = "bounded_hold" in s.cfg["plain"]
        labels = ["hog", "short"]
        hog = s.args("spin", s.cfg["hog_iters"], ms=s.cfg["hog_ms"], plain=plain)
        ph.submit("hog", hog, stage="go", options=s.mem("spin"))
        ph.submit(
            "short",
            s.args("spin", s.cfg["hold_iters"], plain=plain),
            stage="go",
            options=s.mem("spin"),
        )
        ph.wait_ready(labels)
        runs = ph.run_stage("go", labels)
        jobs = ph.gq_jobs(labels)
    finally:
        s.node.gq("policy", "set", "fair", "--max-hold", "2s")
    ph.fig("hog_lane_taken", jobs["hog"].get("lane_taken"), ">=", 1)
    alone = s.alone.get("spin", {}).get("gq")
    ph.fig(
        "short_its_beside_hog/alone",
        ratio(its(runs["short"]), its(alone) if alone and not plain else None),
        note="the short job's throughput beside the hog, against alone under gq",
    )
    lo, hi = window(runs.values())
    ph.fig(
        "overlap",
        overlap([timed(r) for r in runs.values()], lo, hi),
        note="on a GPU a frozen job's queued kernel drains beside the next holder",
    )
    ph.details.update(its={label: its(runs[label]) for label in labels})

"""The GPU check's phases of sharing that pays (bench/gpu_check.py): a sweep of small jobs
packed on one lane against one at a time, and the same sweep with the lanes --lanes auto
chooses by measurement (with MPS on a GPU) against taking turns on one."""

from __future__ import annotations

from gpu_check_config import State

from gpu_check_lib import Phase, mps_controls, overlap, ratio


def sweep_stage(ph: Phase, s: State, args, stage: str) -> dict:
    """The sweep's jobs, started together: makespan (first iteration to last),
    utilization, overlap and the sum of their runs."""
    labels = [f"{stage}-{i}" for i in range(s.cfg["sweep_jobs"])]
    for label in labels:
        ph.submit(label, args, stage=stage, options=s.mem("sweep"))
    ph.wait_ready(labels)
    runs = ph.run_stage(stage, labels)
    ph.gq_jobs(labels)
    lo = min(r["iv"][0][0] for r in runs.values())
    hi = max(r["iv"][-1][1] for r in runs.values())
    return {
        "makespan_s": (hi - lo) / 1e9,
        "utilization": s.sampler.mean(lo, hi),
        "overlap": overlap([r["iv"] for r in runs.values()], lo, hi),
        "sum_of_runs_s": sum(r["iv"][-1][1] - r["iv"][0][0] for r in runs.values()) / 1e9,
    }


def sweep(ph: Phase, s: State) -> None:
    plain = "sweep" in s.cfg["plain"]
    args = s.args("matmul", s.cfg["sweep_iters"], sizes="sweep", plain=plain)
    found = {}
    for policy, stage in (("fifo", "seq"), ("fair", "packed")):
        s.node.gq("policy", "set", policy)
        found[stage] = sweep_stage(ph, s, args, stage)
    seq, packed = found["seq"], found["packed"]
    ph.fig(
        "makespan_seq_s",
        seq["makespan_s"],
        note="fifo: one at a time, all resident; first iteration to last",
    )
    ph.fig("seq_sum_of_runs_s", seq["sum_of_runs_s"], note="without fifo's hand-overs")
    ph.fig("makespan_packed_s", packed["makespan_s"], note="fair: packed on one lane")
    ph.fig("makespan_seq/packed", ratio(seq["makespan_s"], packed["makespan_s"]))
    ph.fig("seq_sum/packed", ratio(seq["sum_of_runs_s"], packed["makespan_s"]))
    ph.fig(f"utilization_seq_{s.sampler.source}", seq["utilization"])
    ph.fig(f"utilization_packed_{s.sampler.source}", packed["utilization"])
    ph.fig("overlap_packed", packed["overlap"])
    ph.details.update(found)


def packing(ph: Phase, s: State) -> None:
    """--lanes auto: the sweep's jobs under fair, with one lane (taking turns) and with the
    lanes chosen by measurement (the daemon started again so), makespan and utilization."""
    plain = "packing" in s.cfg["plain"]
    args = s.args("matmul", s.cfg["sweep_iters"], sizes="sweep", plain=plain)
    base = ["--kill-wait", "1", "--max-resident", "8"]
    variants = {"1": ["--lanes", "1"], "auto": ["--lanes", "auto"]}
    if s.cuda:  # (MPS serves CUDA devices only)
        variants["auto_mps"] = ["--lanes", "auto", "--mps"]
    found = {}
    try:
        for name, options in variants.items():
            s.node.gq("daemon", "stop")
            s.node.gq("daemon", "start", *base, *options)
            s.node.gq("policy", "set", "fair")
            found[name] = sweep_stage(ph, s, args, f"lanes-{name}")
            ph.details[f"sharing_{name}"] = info = s.node.gq("info")
            if name == "auto_mps":
                mps = next((x for x in info.splitlines() if x.startswith("MPS: ")), "none")
                ph.fig("mps", mps, note="gq info's MPS line under --mps")
    finally:
        s.node.gq("daemon", "stop")
        if "auto_mps" in variants:
            left = mps_controls(s.node.dir / "home")
            ph.fig("mps_controls_left", len(left), "<=", 0, note=f"after daemon stop: {left}")
        s.node.gq("daemon", "start", *base, "--lanes", "1")
    one, auto = found["1"], found["auto"]
    ph.fig("makespan_lanes_1_s", one["makespan_s"])
    ph.fig("makespan_auto_s", auto["makespan_s"])
    ph.fig(
        "lanes_1/auto",
        ratio(one["makespan_s"], auto["makespan_s"]),
        ">=",
        1.0 if s.cuda else 1.05,
        note="the sweep's throughput under --lanes auto against taking turns",
    )
    if "auto_mps" in found:
        mps_run = found["auto_mps"]
        ph.fig("makespan_auto_mps_s", mps_run["makespan_s"])
        ph.fig(
            "auto/auto_mps",
            ratio(auto["makespan_s"], mps_run["makespan_s"]),
            note="MPS against driver time-slicing, both --lanes auto (> 1: MPS pays)",
        )
        ph.fig(f"utilization_auto_mps_{s.sampler.source}", mps_run["utilization"])
    ph.fig(f"utilization_lanes_1_{s.sampler.source}", one["utilization"])
    ph.fig(f"utilization_auto_{s.sampler.source}", auto["utilization"])
    ph.details.update(found)

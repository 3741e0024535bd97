"""The GPU check's settings (bench/gpu_check.py): each phase's job sizes, iterations and
time budget, on a GPU or gq's cpu device, full or quick, and the state the phases share."""

from __future__ import annotations

from pathlib import Path

from gpu_check_lib import CheckNode, Sampler

HERE = Path(__file__).resolve().parent
JOB, SHELL_JOB = str(HERE / "gpu_jobs" / "job.py"), str(HERE / "gpu_jobs" / "shell_job.sh")
PROBE = str(HERE / "gpu_jobs" / "env_probe.py")
KINDS = ("spin", "matmul", "launch", "graph")


def config(cpu: bool, quick: bool) -> dict:
    c = {
        "spin_ms": 2.0,
        "iters": {"spin": 1000, "matmul": 300, "launch": 1000, "graph": 1000},
        "fair_iters": 1000,
        "high_iters": 400,
        "high_gap_ms": 6.0,
        "low_ms": 1.0,
        "sweep_jobs": 8,
        "sweep_iters": 400,
        "escape_iters": 600,
        "hog_ms": 1500.0,  # a bounded_hold hog's iteration: far past its --max-hold
        "hog_iters": 4,
        "hold_iters": 1000,
        "max_hold": "300ms",
        "sizes": {
            "matmul": ["--width", 4096, "--batch", 8192, "--layers", 4],
            "launch": ["--layers", 50],
            "graph": ["--width", 4096],
            "sweep": ["--width", 2048, "--batch", 4096, "--layers", 3],
        },
        "mem": {"spin": "2G", "matmul": "8G", "launch": "2G", "graph": "4G", "sweep": "4G"},
        "budgets": {
            "environment": 40,
            "alone": 110,
            "fair_pair": 45,
            "hand_over": 60,
            "priority_fill": 60,
            "sweep": 70,
            "packing": 115,  # three daemons: --lanes 1, auto, auto --mps
            "escapes": 50,
            "bounded_hold": 40,
            "lone_tail": 30,
            "checkpoint": 150,
        },
        # 1, 8 and 40 GB held beside a small deterministic loop (bench/gpu_jobs/hold_train.py)
        "checkpoint": {
            "sizes_mb": [1024, 8192, 40960],
            "iters": 60,
            "mark_at": 20,
            "step_ms": 20,
            "slack_mb": 2048,
        },
        "total": 480,  # 8 minutes: what the prepared run may take on one GPU
        "plain": [],
        "skip": [],
        "kinds": list(KINDS),
    }
    if cpu:
        c.update(
            iters={"spin": 300, "matmul": 300, "launch": 150, "graph": 300},
            fair_iters=300,
            high_iters=150,
            sweep_iters=100,
            escape_iters=200,
            hold_iters=300,
            total=680,
            mem={k: "1G" for k in c["mem"]},
        )
        c["sizes"].update(
            matmul=["--width", 128, "--batch", 128, "--layers", 3],
            sweep=["--width", 64, "--batch", 64, "--layers", 2],
        )
        c["budgets"] = {k: v * 2 for k, v in c["budgets"].items()}
        c["checkpoint"].update(sizes_mb=[64, 256], slack_mb=256)
    if quick:
        c["iters"] = {k: max(20, v // 3) for k, v in c["iters"].items()}
        for key in ("fair_iters", "high_iters", "sweep_iters", "escape_iters", "hold_iters"):
            c[key] = max(30, c[key] // 3)
        c["hog_iters"] = 2
        c["total"] = 110 if cpu else 195
    if cpu and quick:
        c.update(
            plain=["hand_over", "priority_fill", "sweep", "escapes", "bounded_hold", "lone_tail"],
            sweep_jobs=4,
            high_iters=40,
            hog_ms=450.0,
            kinds=["spin"],  # on the CPU graph is no_grad calls: tests/test_scheduling.py
            total=105,
            # CI's run of it: bench/packing.py measures --lanes auto on the cpu device, and
            # tests/test_memory_moves.py the moves of memory (with the fake), and
            # tests/test_handover.py the hand-over on a shared fake device
            skip=["packing", "checkpoint", "hand_over"],
            budgets={
                "environment": 10,
                "alone": 45,
                "fair_pair": 60,  # its two jobs start up under the suite's load
                "hand_over": 25,
                "priority_fill": 25,
                "sweep": 25,
                "packing": 40,
                "escapes": 25,
                "bounded_hold": 15,
                "lone_tail": 15,
                "checkpoint": 40,
            },
        )
    return c


class State:
    def __init__(self, cpu: bool, cfg: dict, node: CheckNode, sampler: Sampler, fake: bool = False):
        self.cpu, self.cuda, self.cfg, self.node, self.sampler = cpu, not cpu, cfg, node, sampler
        self.fake_checkpoints = fake  # the daemon's --checkpoint fake (the cpu device's)
        self.alone: dict[str, dict] = {}
        # Every job on one device: -G 0 (gq's cpu device), or the GPU gq names first.
        self.place = ["-G", "0"] if cpu else []

    def args(self, kind, iters, *, ms=None, gap=None, sizes=None, plain=False) -> list:
        args = [
            "--kind",
            kind,
            "--device",
            "cpu" if self.cpu else "cuda",
            "--iters",
            iters,
            "--ms",
            ms or self.cfg["spin_ms"],
            *self.cfg["sizes"].get(sizes or kind, []),
        ]
        return args + (["--gap-ms", gap] if gap else []) + (["--plain"] if plain else [])

    def mem(self, kind) -> list:
        return ["--gpu-mem", self.cfg["mem"][kind]]

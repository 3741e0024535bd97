"""What iteration boundaries cost a job in its own process: gq's hooks and its worker's
session, with no host, no other job and none of their noise.

  python bench/boundary_cost.py [--runs 3]

Each figure is one process running bench/jobs/train_loop.py's iteration (a forward,
backward and optimizer step, no host-side work) in batches, pinned to one CPU, keeping its
fastest batch (noise only ever adds); the processes alternate, and a figure is the median of
--runs of them. Modes:
- bare: no gq;
- hooks: gq's hooks, with a session that does nothing (their own cost: the wrapper around
  Module.__call__, the optimizer's post-hook, the backward wrapper until an optimizer steps);
- leased: the hooks with the worker's session holding a lease, as a job alone on its lane
  runs (every boundary crossed in memory: gq.exec.lane.lease).
Models: the bench's one Linear layer, and 10 Linear+ReLU pairs in a Sequential (21 module
calls an iteration, what each nested call costs). switching.py measures this end to end,
with the host; this part is steady enough to compare two versions of gq by.
Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import timeit

MODES = ("bare", "hooks", "leased")
MODELS = {"linear": 0, "deep": 10}  # Linear+ReLU pairs before the last Linear
BATCH = {"linear": (300, 300), "deep": (100, 200)}  # iterations a batch, batches


def child(mode: str, model_name: str) -> float:
    """Microseconds an iteration, in the fastest batch."""
    import torch

    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    torch.manual_seed(0)
    torch.set_num_threads(1)
    pairs = [
        m for _ in range(MODELS[model_name]) for m in (torch.nn.Linear(16, 16), torch.nn.ReLU())
    ]
    model = torch.nn.Sequential(*pairs, torch.nn.Linear(16, 1)) if pairs else torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(8, 16)
    if mode != "bare":
        from gq.exec.job import hooks

        session = _Idle() if mode == "hooks" else _leased_session()
        hooks.install(session, torch)

    def iteration() -> None:
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()

    number, repeat = BATCH[model_name]
    for _ in range(number * 5):
        iteration()
    return min(timeit.repeat(iteration, number=number, repeat=repeat)) / number * 1e6


class _Idle:
    def acquire(self) -> None: ...

    def release(self) -> None: ...

    def count_step(self, kind: str) -> None: ...


def _leased_session():
    """The worker's session as the host left it after a Go with a lease."""
    from gq.exec.job.worker import WorkerSession
    from gq.exec.job.worker_link import WorkerChannel
    from gq.exec.lane.lease import SharedPage

    host_page, fd = SharedPage.create()
    host_page.offer(1)
    host_page.give()
    worker_end, host_end = socket.socketpair()
    session = WorkerSession(WorkerChannel(worker_end), None, SharedPage.attach(fd))
    session.lease.granted(1, 0)
    session.host_page = host_page  # kept: its lock is the host's side
    session.held = True
    session.host_end = host_end  # kept open: a message to a closed socket would fail it
    return session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(child(*args.child))
        return
    figures: dict[str, dict[str, list[float]]] = {m: {k: [] for k in MODES} for m in MODELS}
    for _ in range(args.runs):  # alternated, so that drift hits each alike
        for model_name in MODELS:
            for mode in MODES:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", mode, model_name],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                figures[model_name][mode].append(float(out))
    result = {"runs": args.runs, "models": {}}
    for model_name, by_mode in figures.items():
        median = {mode: statistics.median(values) for mode, values in by_mode.items()}
        result["models"][model_name] = {
            "iteration_us": median,
            "hooks_us": median["hooks"] - median["bare"],
            "leased_us": median["leased"] - median["bare"],
            "runs_us": by_mode,
        }
    print(json.dumps(result, indent=2))
    linear, deep = result["models"]["linear"], result["models"]["deep"]
    nested = (deep["hooks_us"] - linear["hooks_us"]) / 20
    print(
        f"\nper iteration, one Linear (bare {linear['iteration_us']['bare']:.1f} us): hooks "
        f"+{linear['hooks_us']:.1f} us, hooks and a leased session +{linear['leased_us']:.1f}"
        f" us; 21 module calls (bare {deep['iteration_us']['bare']:.1f} us): hooks "
        f"+{deep['hooks_us']:.1f} us, leased +{deep['leased_us']:.1f} us, so "
        f"{nested:.1f} us a nested module call; medians of {args.runs} runs, each its "
        "fastest batch on one CPU"
    )


if __name__ == "__main__":
    main()

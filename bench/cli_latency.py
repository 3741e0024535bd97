"""CLI and admission latency, measured in one run as ratios to Python's own start-up:
whole-process medians of `gq submit --parsable`, `gq status` (20 jobs in the queue) and
`gq show --json` next to `python -c pass`, and how long a submitted job waits before it
starts on an idle node.

  python bench/cli_latency.py [--runs 20] [--python PATH] [--big-queue]

``--big-queue`` measures ``gq status`` instead with ten arrays of 1,000 held tasks queued (a
sweep's daily case), plainly, with ``--json``, ``--all``, ``--user``, ``--state PD``, and
with ``--array-tasks``, which lists each task (and is not held to the same target).

gq's modules are byte-compiled first, as an installed gq is (pip compiles on install), so
that the figure does not include compiling gq's source on every command. ``--python`` runs
the commands and ``python -c pass`` with another interpreter that has gq's dependencies (this
gq goes first on its path): a ratio is only as honest as its baseline, and an interpreter
whose own start-up is slow (many .pth files, say) flatters gq; a plain venv is what users
have.
Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import pwd
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def timed(node: Node, *argv: str) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=node.env, cwd=node.dir, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter the commands run with (default: this one)",
    )
    parser.add_argument(
        "--big-queue",
        action="store_true",
        help="gq status with 10 arrays of 1,000 held tasks queued",
    )
    args = parser.parse_args()
    compileall.compile_dir(ROOT / "gq", quiet=1)
    if args.big_queue:
        big_queue(args)
        return
    gq = [args.python, "-m", "gq"]
    with Node("--kill-wait", "1") as node:
        _use_this_gq(node)
        script = node.dir / "noop.sh"
        script.write_text("true\n")
        held = node.dir / "held.sh"
        held.write_text("true\n")
        for _ in range(20):  # the queue status lists
            node.submit("--hold", str(held))
        timed(node, *gq, "status")  # warm the page cache
        submit_times, status_times, show_times, bare, waits = [], [], [], [], []
        for _ in range(args.runs):  # interleaved, so that drift hits each alike
            bare.append(timed(node, args.python, "-c", "pass"))
            submit_times.append(timed(node, *gq, "submit", "--parsable", str(script)))
            status_times.append(timed(node, *gq, "status"))
            show_times.append(timed(node, *gq, "show", "--json", "1"))
        for _ in range(min(args.runs, 10)):
            job_id = node.submit(str(script))
            info = node.wait_all([job_id])[0]
            waits.append(
                (
                    datetime.fromisoformat(info["start_time"])
                    - datetime.fromisoformat(info["submit_time"])
                ).total_seconds()
            )
    python = statistics.median(bare)
    result = {
        "runs": args.runs,
        "python": args.python,
        "python_pass_median_s": python,
        "submit_median_s": statistics.median(submit_times),
        "status_median_s": statistics.median(status_times),
        "show_median_s": statistics.median(show_times),
        "submit_ratio": statistics.median(submit_times) / python,
        "status_ratio": statistics.median(status_times) / python,
        "show_ratio": statistics.median(show_times) / python,
        "start_wait_median_s": statistics.median(waits),
        "start_wait_max_s": max(waits),
    }
    print(json.dumps(result, indent=2))
    print(
        f"\npython -c pass {1000 * python:.0f} ms; gq submit --parsable "
        f"{1000 * result['submit_median_s']:.0f} ms ({result['submit_ratio']:.2f}x, target "
        f"<= 2.5x); gq status with 20 jobs {1000 * result['status_median_s']:.0f} ms "
        f"({result['status_ratio']:.2f}x, target <= 2.5x); gq show --json "
        f"{1000 * result['show_median_s']:.0f} ms ({result['show_ratio']:.2f}x); whole "
        f"process, median of {args.runs}. Submit to start on an idle node: median "
        f"{1000 * result['start_wait_median_s']:.1f} ms, max "
        f"{1000 * result['start_wait_max_s']:.1f} ms"
    )


ARRAYS, TASKS = 10, 1000


def big_queue(args: argparse.Namespace) -> None:
    """gq status and its filters, whole process, against python -c pass, with ARRAYS arrays
    of TASKS held tasks queued."""
    gq = [args.python, "-m", "gq"]
    user = pwd.getpwuid(os.getuid()).pw_name
    variants = {
        "status": [],
        "status --json": ["--json"],
        "status --all": ["--all"],
        "status --user": ["--user", user],
        "status --state PD": ["--state", "PD"],
        "status --array-tasks": ["--array-tasks"],
    }
    with Node("--kill-wait", "1", "--max-pending", str(ARRAYS * TASKS)) as node:
        _use_this_gq(node)
        held = node.dir / "held.sh"
        held.write_text("true\n")
        for _ in range(ARRAYS):
            node.submit("--hold", "--array", f"0-{TASKS - 1}", str(held))
        times: dict[str, list[float]] = {"python -c pass": []}
        times.update((name, []) for name in variants)
        timed(node, *gq, "status")  # warm the page cache
        for _ in range(args.runs):  # interleaved, so that drift hits each alike
            times["python -c pass"].append(timed(node, args.python, "-c", "pass"))
            for name, options in variants.items():
                times[name].append(timed(node, *gq, "status", *options))
    medians = {name: statistics.median(values) for name, values in times.items()}
    python = medians["python -c pass"]
    result = {
        "runs": args.runs,
        "python": args.python,
        "pending_array_tasks": ARRAYS * TASKS,
        "arrays": ARRAYS,
        "median_s": medians,
        "ratio": {name: median / python for name, median in medians.items()},
    }
    print(json.dumps(result, indent=2))
    print(
        f"\n{ARRAYS} arrays of {TASKS} held tasks queued; whole process, median of "
        f"{args.runs}; python -c pass {1000 * python:.0f} ms; "
        + "; ".join(
            f"gq {name} {1000 * medians[name]:.0f} ms ({medians[name] / python:.2f}x)"
            for name in variants
        )
        + " (target <= 2x, --array-tasks excepted)"
    )


def _use_this_gq(node: Node) -> None:
    """The commands import this gq, wherever they run."""
    node.env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [node.env.get("PYTHONPATH")])]
    )


if __name__ == "__main__":
    main()

"""A month of history: CLI latency with 100,000 finished jobs in the queue, as ratios.

  python bench/history.py [--finished 100000] [--runs 15]

Medians of whole processes (`gq status`, `gq status --all`, `gq history`, and `python -c
pass` beside them, interleaved), first with one finished job in the queue, then with
--finished more written to it directly (as a month of use leaves them). Finished jobs come a
page at a time, newest first, so the figures should barely move; the whole history
(`gq history --limit 0 --json`) is timed once for scale. gq's modules are byte-compiled
first, as an installed gq is. Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import compileall
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"status": ["status"], "status_all": ["status", "--all"], "history": ["history"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    compileall.compile_dir(ROOT / "gq", quiet=1)
    with Node("--kill-wait", "1") as node:
        script = node.dir / "s.sh"
        script.write_text("true\n")
        first = node.submit(str(script))
        node.end_states([first])
        small = _medians(node, args.runs)
        node.prefill(first, args.finished)
        large = _medians(node, args.runs)
        start = time.perf_counter()
        everything = json.loads(node.gq("history", "--limit", "0", "--json"))
        whole = time.perf_counter() - start
    result = {
        "finished_jobs": args.finished + 1,
        "runs": args.runs,
        "one_finished_job_s": small,
        f"{args.finished + 1}_finished_jobs_s": large,
        "ratio_to_python": {name: large[name] / large["python"] for name in COMMANDS},
        "ratio_to_one_finished_job": {name: large[name] / small[name] for name in COMMANDS},
        "whole_history_s": whole,
        "whole_history_jobs": len(everything),
    }
    print(json.dumps(result, indent=2))
    print(
        f"\nwith {args.finished + 1} finished jobs (vs one): "
        + "; ".join(
            f"gq {' '.join(argv)} {1000 * large[name]:.0f} ms ({1000 * small[name]:.0f} ms, "
            f"{result['ratio_to_python'][name]:.2f}x python -c pass)"
            for name, argv in COMMANDS.items()
        )
        + f"; python -c pass {1000 * large['python']:.0f} ms; the whole history "
        f"(--limit 0 --json, {len(everything)} jobs) {whole:.1f} s"
    )


def _medians(node: Node, runs: int) -> dict[str, float]:
    gq = [sys.executable, "-m", "gq"]
    times: dict[str, list[float]] = {name: [] for name in ("python", *COMMANDS)}
    node.gq("status")  # warm the page cache
    for _ in range(runs):  # interleaved, so that drift hits each alike
        times["python"].append(_timed(node, sys.executable, "-c", "pass"))
        for name, argv in COMMANDS.items():
            times[name].append(_timed(node, *gq, *argv))
    return {name: statistics.median(values) for name, values in times.items()}


def _timed(node: Node, *argv: str) -> float:
    import subprocess

    start = time.perf_counter()
    subprocess.run(argv, env=node.env, cwd=node.dir, check=True, capture_output=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()

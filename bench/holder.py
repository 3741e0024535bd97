"""What a job that holds its lane loses to the jobs resident beside it, on the cpu device.

  python bench/holder.py [--steps 3000] [--repeats 3] [--out holder.json]

A throwaway personal daemon with ``--lanes 1``; every job is ``examples/kernel_train.py
--no-torch`` with 1 ms iterations (a sleep in ``gq.steps``: lane time, no CPU).

- **fifo**: the head job alone, and with a second job resident and waiting behind it (fifo
  never grants it the lane before the head job ends);
- **priority, --fill never**: a priority-5 job alone, and beside a priority-0 job waiting;
- **fair**: two such jobs sharing the lane, their window (first start to last end) against
  the same jobs one after the other, alone.

Each case runs alone and beside, alternated, ``--repeats`` times; the figure is the median
ratio of the holder's run time alone to beside (fifo, priority) or of one at a time to the
pair's window (fair). Targets (issue: sharing that pays): a holder keeps >= 0.9 of its
alone speed beside jobs the policy would not grant the lane to; two 1 ms jobs under fair
keep >= 0.8 of the throughput of taking turns without switching costs. Prints one JSON
object, then a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402

LOOP = str(Path(__file__).resolve().parents[1] / "examples" / "kernel_train.py")
DECLARED = ("--gpu-mem", "512M")  # resident at once, not after a probe


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _loop(node: Node, steps: int, *options: str) -> int:
    return node.submit(
        *DECLARED, *options, LOOP, "--no-torch", "--steps", str(steps), "--iter-ms", "1"
    )


def holder_run(policy: list[str], steps: int, beside: bool, priorities: tuple[str, str]) -> float:
    """The holder's run time (seconds), alone or with a second job waiting beside it."""
    with Node("--lanes", "1") as node:
        node.gq("policy", "set", *policy)
        holder = _loop(node, steps, "--priority", priorities[0])
        ids = [holder]
        if beside:
            ids.append(_loop(node, max(1, steps // 10), "--priority", priorities[1]))
        ended = node.wait_all(ids)
        return float(ended[0]["run_time"])


def fair_window(steps: int, pair: bool) -> float:
    """Two jobs' window: together on one lane under fair, or one after the other alone."""
    with Node("--lanes", "1") as node:
        node.gq("policy", "set", "fair")
        if pair:
            ended = node.wait_all([_loop(node, steps), _loop(node, steps)])
        else:
            ended = node.wait_all([_loop(node, steps)])
            ended += node.wait_all([_loop(node, steps)])
            return sum(float(j["run_time"]) for j in ended)
        first = min(_stamp(j["start_time"]) for j in ended)
        return max(_stamp(j["end_time"]) for j in ended) - first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cases = {
        "fifo": (["fifo"], ("0", "0")),
        "priority_never": (["priority", "--fill", "never"], ("5", "0")),
    }
    result: dict = {"steps": args.steps, "repeats": args.repeats, "cases": {}}
    for name, (policy, priorities) in cases.items():
        runs = [
            (
                holder_run(policy, args.steps, False, priorities),
                holder_run(policy, args.steps, True, priorities),
            )
            for _ in range(args.repeats)
        ]
        ratios = [alone / beside for alone, beside in runs]
        result["cases"][name] = {"runs": runs, "kept": statistics.median(ratios), "target": 0.9}
    pairs = [
        (fair_window(args.steps, False), fair_window(args.steps, True)) for _ in range(args.repeats)
    ]
    kept = statistics.median(turns / pair for turns, pair in pairs)
    result["cases"]["fair_pair"] = {"runs": pairs, "kept": kept, "target": 0.8}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    for name, case in result["cases"].items():
        verdict = "PASS" if case["kept"] >= case["target"] else "FAIL"
        print(f"{name}: kept {case['kept']:.2f} of alone (target >= {case['target']}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

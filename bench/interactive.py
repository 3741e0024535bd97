"""A batch job beside an interactive one on one device: the batch job's throughput alone,
beside an idle REPL and beside a REPL that computes (within its burst, and past it), and how
long a REPL's statement waits for the lane behind the batch job, under fifo and fair (gq's
people-first turn).

  python bench/interactive.py [--seconds 15] [--iteration 0.05] [--out interactive.json]

A throwaway personal daemon on the cpu device; the REPL is `gq run --pty -- python`, driven
through a real pseudo-terminal (pexpect). Both jobs' iterations busy the CPU for --iteration
seconds inside the lane, so the figures are lane time, not device time. Prints one JSON
object, then a summary.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import pexpect

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402

SETTLE = 30.0  # seconds of the REPL computing between the two windows: past its burst

BATCH = """import gq, sys, time
iteration = float(sys.argv[1])
for _ in gq.steps(range(10**9)):
    end = time.perf_counter() + iteration
    while time.perf_counter() < end:
        pass
"""
# Typed at the REPL: a step that busies the CPU, and a loop of them for a while.
SETUP = (
    "import gq, itertools, time; g = gq.steps(itertools.count())\n"
    "def step(seconds):\n    next(g); end = time.perf_counter() + seconds\n"
    "    while time.perf_counter() < end: pass\n\n"
)


def _steps(node: Node, job_id: int) -> int:
    return json.loads(node.gq("show", "--json", str(job_id)))["steps_done"]


def _rate(node: Node, job_id: int, seconds: float) -> float:
    """The job's steps per second over ``seconds``, from its own record."""
    first, began = _steps(node, job_id), time.monotonic()
    time.sleep(seconds)
    return (_steps(node, job_id) - first) / (time.monotonic() - began)


def _repl(node: Node) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "gq", "run", "--pty", "--gpu-mem", "64M", "--", "python"],
        env=node.env,
        cwd=str(node.dir),
        encoding="utf-8",
        timeout=60,
    )
    child.expect(">>> ")
    child.send(SETUP)
    child.expect(">>> ")
    return child


def _waits(child: pexpect.spawn, count: int, iteration: float) -> list[float]:
    """Seconds each of ``count`` statements (one short step each, typed one by one, a pause
    of one to four batch iterations before each, so that they come at any point of one)
    waited for its grant, as the statement itself timed it. A statement's end gives its
    lane back, as at a person's REPL."""
    rng = random.Random(1)
    child.sendline("w = []")
    child.expect(">>> ")
    for _ in range(count):
        time.sleep(rng.uniform(iteration, iteration * 4))
        child.sendline("t = time.perf_counter(); step(0.001); w.append(time.perf_counter() - t)")
        child.expect(">>> ")
    child.sendline("print('waits', ','.join('%.5f' % x for x in w))")
    child.expect(r"waits ([\d.,]+)")
    return [float(x) for x in child.match.group(1).split(",")]


SHORT_STEPS, SHORT_STEP = 200, 0.005  # a statement of many short steps (a cell's forwards)


def _short_statement(child: pexpect.spawn) -> float:
    """Seconds a statement of SHORT_STEPS steps of SHORT_STEP each took, as it timed itself."""
    child.sendline(
        f"t = time.perf_counter()\nfor _ in range({SHORT_STEPS}): step({SHORT_STEP})\n\n"
        "print('short %.3f' % (time.perf_counter() - t))"
    )
    child.expect(r"short ([\d.]+)", timeout=SHORT_STEPS * 2)
    took = float(child.match.group(1))
    child.expect(">>> ")
    return took


def measure(policy: str, seconds: float, iteration: float) -> dict:
    with Node() as node:
        node.gq("policy", "set", policy)
        script = node.dir / "batch.py"
        script.write_text(BATCH)
        batch = node.submit("--gpu-mem", "64M", str(script), str(iteration))
        deadline = time.monotonic() + 60
        while _steps(node, batch) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        alone = _rate(node, batch, seconds)
        child = _repl(node)
        idle = _rate(node, batch, seconds)
        waits = _waits(child, 30, iteration)
        short_beside = _short_statement(child)
        computing = 2.5 + seconds + SETTLE + seconds + 2.5
        child.sendline(
            f"n = 0; end = time.monotonic() + {computing}\n"
            f"while time.monotonic() < end:\n    step({iteration}); n += 1\n"
        )
        time.sleep(2.5)
        busy = _rate(node, batch, seconds)  # within the REPL's burst
        time.sleep(SETTLE)
        sustained = _rate(node, batch, seconds)  # past it: the REPL is a batch job now
        child.expect(">>> ", timeout=computing + 60)
        child.sendline("print('repl', n)")
        child.expect(r"repl (\d+)")
        repl_steps = int(child.match.group(1))
        node.gq("cancel", str(batch))
        while json.loads(node.gq("show", "--json", str(batch)))["state"] != "CANCELLED":
            time.sleep(0.2)
        short_alone = _short_statement(child)
        child.sendeof()
        child.expect(pexpect.EOF)
    return {
        "policy": policy,
        "batch_alone": alone,
        "batch_beside_idle_repl": idle,
        "batch_beside_busy_repl": busy,
        "batch_beside_sustained_repl": sustained,
        "repl_busy_rate": repl_steps / computing,
        "statement_wait_median": statistics.median(waits),
        "statement_wait_max": max(waits),
        "statement_waits": waits,
        "short_statement_alone": short_alone,
        "short_statement_beside": short_beside,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--iteration", type=float, default=0.05)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = {
        "iteration": args.iteration,
        "seconds": args.seconds,
        "runs": [measure(policy, args.seconds, args.iteration) for policy in ("fifo", "fair")],
    }
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)
    print(f"\nbatch iterations of {args.iteration * 1000:.0f} ms; rates in iterations/s")
    for run in results["runs"]:
        print(
            f"{run['policy']:5}: batch alone {run['batch_alone']:.1f}, beside an idle REPL "
            f"{run['batch_beside_idle_repl']:.1f} "
            f"({run['batch_beside_idle_repl'] / run['batch_alone']:.0%}), beside a busy REPL "
            f"{run['batch_beside_busy_repl']:.1f} "
            f"({run['batch_beside_busy_repl'] / run['batch_alone']:.0%}), "
            f"{SETTLE:.0f} s later {run['batch_beside_sustained_repl']:.1f} "
            f"({run['batch_beside_sustained_repl'] / run['batch_alone']:.0%}; the REPL "
            f"{run['repl_busy_rate']:.1f} all along); a statement waited "
            f"{run['statement_wait_median'] * 1000:.0f} ms (median), "
            f"{run['statement_wait_max'] * 1000:.0f} ms at most; a statement of "
            f"{SHORT_STEPS} steps of {SHORT_STEP * 1000:.0f} ms took "
            f"{run['short_statement_alone']:.1f} s alone, "
            f"{run['short_statement_beside']:.1f} s beside the batch job"
        )


if __name__ == "__main__":
    main()

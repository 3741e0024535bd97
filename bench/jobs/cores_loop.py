"""A loop of iterations of fixed *work* on the CPU (not fixed time: a job slowed by a
neighbour takes longer), each spread over ``--threads`` threads (hashing releases the GIL,
so N threads keep N cores busy), marked with gq.steps; with ``--wait-ms``, each also waits
that long, on nothing of the device's (as a step waits on an input pipeline or a remote
store): two such jobs gain side by side whatever else takes the machine's cores.

  python cores_loop.py --steps 200 --threads 1 --mb 8 [--wait-ms MS] [--lock FILE] [--out FILE]

Writes one JSON line to --out (if given): the loop's wall time and its steps.
"""

import argparse
import fcntl
import hashlib
import json
import threading
import time

import gq

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--mb", type=int, default=8, help="megabytes each thread hashes a step")
parser.add_argument("--wait-ms", type=float, default=0.0, help="what each step waits besides")
parser.add_argument("--out")
parser.add_argument(
    "--lock",
    help="a file each step's work holds a lock on: two jobs with the same file never work at "
    "once (as two jobs' kernels on one GPU), so side by side they gain nothing",
)
args = parser.parse_args()
lock = open(args.lock, "a") if args.lock else None  # noqa: SIM115 - held for the loop

block = bytes(1 << 20)


def work() -> None:
    for _ in range(args.mb):
        hashlib.sha256(block).digest()


start = time.monotonic()


def step() -> None:
    time.sleep(args.wait_ms / 1000)
    if args.threads == 1:
        work()
        return
    threads = [threading.Thread(target=work) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


for _ in gq.steps(range(args.steps), total=args.steps):
    if lock is None:
        step()
        continue
    fcntl.flock(lock, fcntl.LOCK_EX)
    step()
    fcntl.flock(lock, fcntl.LOCK_UN)
wall = time.monotonic() - start
if args.out:
    with open(args.out, "w") as out:
        out.write(json.dumps({"wall": wall, "steps": args.steps}) + "\n")

"""A loop of fixed-length iterations (busy work, so timing is exact) marked with gq.steps.

Run bare (python spin_loop.py ...) gq.steps does nothing; under gq each iteration holds
the lane. Writes one JSON line: the loop's wall time and every iteration's (start, end)
on the system-wide monotonic clock, so iterations of several jobs can be interleaved.
"""

import argparse
import json
import os
import time

import gq

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--iter-ms", type=float, required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()

length = args.iter_ms / 1000
spans = []
start = time.monotonic()
for _ in gq.steps(range(args.steps)):
    begin = time.monotonic()
    while time.monotonic() - begin < length:
        pass
    spans.append((begin, time.monotonic()))
loop = time.monotonic() - start
with open(args.out, "a") as out:
    out.write(json.dumps({"job": os.environ.get("GQ_JOB_ID"), "loop_seconds": loop,
                          "spans": spans}) + "\n")

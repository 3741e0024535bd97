"""A loop of fixed-length iterations (busy work, so timing is exact) marked with gq.steps.

Run bare (python spin_loop.py ...) gq.steps does nothing; under gq each iteration holds
the lane. Writes one JSON line: the loop's wall time and every iteration's (start, end, when it
asked for the lane) on the system-wide monotonic clock, so iterations of several jobs can
be interleaved.
"""

import argparse
import json
import os
import time

import gq

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--iter-ms", type=float, required=True)
parser.add_argument(
    "--gap-ms",
    type=float,
    default=0.0,
    help="busy work between iterations (fetching the next item: released)",
)
parser.add_argument("--out", required=True)
args = parser.parse_args()

length, gap = args.iter_ms / 1000, args.gap_ms / 1000


asked = [0.0]  # when it last asked for the lane: the end of its gap


def items():
    for item in range(args.steps):
        if item:
            ended = time.monotonic()
            while time.monotonic() - ended < gap:
                pass
        asked[0] = time.monotonic()
        yield item


spans = []
start = time.monotonic()
for _ in gq.steps(items(), total=args.steps):
    begin = time.monotonic()
    while time.monotonic() - begin < length:
        pass
    spans.append((begin, time.monotonic(), asked[0]))
loop = time.monotonic() - start
with open(args.out, "a") as out:
    out.write(
        json.dumps({"job": os.environ.get("GQ_JOB_ID"), "loop_seconds": loop, "spans": spans})
        + "\n"
    )

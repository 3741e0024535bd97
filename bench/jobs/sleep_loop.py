"""A loop of fixed-length iterations marked with gq.steps, each a sleep (a device kernel
of known length, which a busy CPU does not stretch), and no import of torch: any user's
interpreter runs it. The loop does not declare its length (an iterator has none): --steps on
gq submit says it, or nothing does.

  python sleep_loop.py STEPS ITER_MS
"""

import sys
import time

import gq

steps, length = int(sys.argv[1]), float(sys.argv[2]) / 1000
for _ in gq.steps(iter(range(steps))):
    time.sleep(length)

#!/bin/sh
# The GPU check's shell job: a plain process (gq sees no iterations in it) that runs its
# arguments with the check's Python, e.g. job.py --kind spin ...: its device work escapes
# the lane.
exec "${GQ_CHECK_PYTHON:-python3}" "$@"

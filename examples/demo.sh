#!/usr/bin/env bash
# The tour: start the daemon, queue the example jobs under srtf, watch them, show history.
set -euo pipefail
cd "$(dirname "$0")"
gq() { python3 -m gq "$@"; }

gq daemon start
gq policy set srtf
gq submit -J long --steps 1500 train.py --steps 1500
gq submit -J short --steps 150 train.py --steps 150
gq submit hello.sh
sleep 1
gq status
echo "waiting for the jobs to finish (srtf: 'short' finishes first although it came second)..."
while [ -n "$(gq status --json | python3 -c 'import json,sys; print(json.load(sys.stdin) or "")')" ]; do
    sleep 1
done
gq status --all
gq history
echo "completion order: $(gq history --json | python3 -c '
import json, sys
jobs = sorted(json.load(sys.stdin), key=lambda j: j["end_time"])
print(", ".join(j["name"] for j in jobs))')"
gq info

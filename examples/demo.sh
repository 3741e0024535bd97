#!/usr/bin/env bash
# The tour: a personal daemon in a throwaway GQ_HOME, the example jobs under srtf, their
# status and history. Everything it writes goes to a temporary directory, removed at the end.
set -euo pipefail
examples="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d -t gq-demo.XXXXXX)"
export GQ_HOME="$work/home"
gq() { python3 -m gq "$@"; }
trap 'gq daemon stop >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
cd "$work"

gq daemon start
gq policy set srtf
# Each declares its device memory (train.py holds about 310M): a job that declares none has
# its lane to itself until its first iterations are measured.
gq submit -J long --steps 1500 --gpu-mem 512M "$examples/train.py" --steps 1500
gq submit -J short --steps 150 --gpu-mem 512M "$examples/train.py" --steps 150
gq submit "$examples/hello.sh"
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

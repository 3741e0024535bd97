#!/usr/bin/env bash
# The tour, in about a minute: what gq buys on one device.
#  1. A long, a medium and a short job, queued in that order and released together, under
#     fifo and then under srtf: under srtf the short job no longer waits for the others
#     (JCT, from gq history).
#  2. Two jobs whose steps mostly wait (on their input, as a small job leaves its GPU idle),
#     one at a time (--lanes 1), then under --lanes auto (the default), which runs them
#     side by side where it measures that it pays: the pair's makespan each way.
# A personal daemon in a throwaway GQ_HOME; everything goes to a temporary directory,
# removed at the end, and the daemon is stopped however the tour ends (Ctrl-C included).
set -euo pipefail
examples="$(cd "$(dirname "$0")" && pwd)"
loop="$examples/../bench/jobs/cores_loop.py" # fixed work a step, as bench/packing.py runs
work="$(mktemp -d -t gq-demo.XXXXXX)"
export GQ_HOME="$work/home"
gq() { python3 -m gq "$@"; }
trap 'gq daemon stop >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
# A Ctrl-C that a gq command swallows as it exits (exit status 0) would go unnoticed by bash
# without a trap of its own: with one, bash leaves once that command has ended.
trap 'exit 130' INT TERM
cd "$work"
table() { gq history --json --limit 0 | python3 "$examples/demo_table.py" "$@"; }

# Iterations of 10 ms sleeps marked by gq.steps (kernel_train.py --no-torch: no torch to
# import, so what the figures show is the scheduling); --steps tells srtf each job's
# length, --gpu-mem its memory (a job that declares none is measured alone first). Queued
# held and released together, so that each policy orders the same three jobs, however long
# a submission takes on a busy machine.
three_jobs() {
    local job ids=()
    for job in long:300 medium:120 short:30; do
        ids+=("$(gq submit --parsable --hold -J "${job%:*}" --steps "${job#*:}" --gpu-mem 64M \
            "$examples/kernel_train.py" --no-torch --iter-ms 10 --steps "${job#*:}")")
    done
    gq release "${ids[@]}" >/dev/null
    echo "${ids[*]}"
}

echo "== 1. three jobs on one lane, taking turns an iteration at a time: fifo, then srtf"
gq daemon start --lanes 1
for policy in fifo srtf; do
    gq policy set "$policy"
    ids=$(three_jobs)
    declare "$policy=${ids// /,}"
    sleep 1
    echo "-- gq status, a second after releasing them (it lists no job that has ended):"
    gq status
    gq wait $ids >/dev/null
done
echo
echo "JCT (submission to end), from gq history: under srtf the short job waits for nobody"
table jct "fifo=$fifo" "srtf=$srtf"

echo
echo "== 2. two jobs whose steps mostly wait on their input: one at a time, then packed"
# A step: 2 MB hashed on one thread (about 1.5 ms), then 5 ms of waiting, as a small job's
# step waits on its data loader while its GPU idles: packed, one job's wait is the other's
# turn, however busy the machine's cores are.
pair() {
    local name
    for name in one two; do
        gq submit --parsable -J "$name" --gpu-mem 64M "$loop" --steps 800 --threads 1 \
            --mb 2 --wait-ms 5
    done | paste -sd,
}
# rr, kept across the restart: both take turns at first, so the host times each and
# judges packing by the pair's work (under fifo the second, never run alone, has no pace)
gq policy set rr
turns=$(pair)
gq wait ${turns//,/ } >/dev/null
gq daemon stop >/dev/null
gq daemon start # --lanes auto, the default
packed=$(pair)
sleep 4
echo "-- gq info, 4 s in under --lanes auto: how the two share the device, and why"
gq info | grep 'lanes:' || true
gq wait ${packed//,/ } >/dev/null
echo
echo "the pair's makespan (first submission to last end), from gq history"
table makespan "--lanes 1=$turns" "--lanes auto=$packed"

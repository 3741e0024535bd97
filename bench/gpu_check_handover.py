"""The GPU check's hand-over phase (bench/gpu_check.py): two spin jobs of one user (2 ms
kernels) under fair on one lane, started together. At each contended release the holder
sends its Done with an interprocess CUDA event and the successor's stream waits on it
(gq.exec.lane.handover), so the device should not idle between their iterations and the
two should never run at once.

From the jobs' own CUDA timing events on the common monotonic clock (bench/gpu_jobs/job.py),
within the window both loops ran: the share of it the device ran neither job's iteration
(``idle_between_iterations``, <= 0.05), their overlap (0, within what mapping each process's
events onto the clock can err: 0.001 of the window), the hand-overs whose successor began
more than 50 us before its holder ended (0), and the gaps at hand-overs (INFO). Then a
holder that kills itself just after its last release, a 3 s tail of it on the device, beside
a successor waiting on its event: the successor must go on (``successor_after_dead_holder``,
>= 1), and its longest gap says whether it waited for the dead holder's tail (INFO). On the
cpu device (--cpu) there are no CUDA events and a release waits for nothing: INFO only, and
no dead holder.
"""

from __future__ import annotations

import statistics

from gpu_check_lib import JobFailed, Phase, PhaseTimeout, length, merge, overlap, timed, window

OVERLAP_SLACK_NS = 50_000  # an interval's ends as two processes' events map them can differ


def hand_over_gaps(groups, lo, hi) -> list[int]:
    """ns from one group's interval to the next group's, at each change of group, within
    [lo, hi] (negative: the next began before the last ended)."""
    tagged = sorted(
        (s, e, n) for n, group in enumerate(groups) for s, e in group if s >= lo and e <= hi
    )
    return [b[0] - a[1] for a, b in zip(tagged, tagged[1:]) if a[2] != b[2]]


def hand_over(ph: Phase, s) -> None:
    s.node.gq("policy", "set", "fair")
    labels = ["H1", "H2"]
    plain = "hand_over" in s.cfg["plain"]
    for label in labels:
        args = s.args("spin", s.cfg["fair_iters"], plain=plain)
        ph.submit(label, args, stage="go", options=s.mem("spin"))
    ph.wait_ready(labels)
    runs = ph.run_stage("go", labels)
    lo, hi = window(runs.values())
    groups = [timed(runs[label]) for label in labels]
    busy = length(merge([iv for group in groups for iv in group], lo, hi))
    idle = (hi - lo - busy) / (hi - lo) if hi > lo else None
    gaps = hand_over_gaps(groups, lo, hi)
    cuda = s.cuda
    note = None if cuda else "the cpu device: no CUDA events, nothing handed over"
    ph.fig("idle_between_iterations", idle, "<=" if cuda else None, 0.05, note=note)
    ph.fig("overlap", overlap(groups, lo, hi), "<=" if cuda else None, 0.001)
    ph.fig(
        "hand_overs_overlapping",
        sum(1 for gap in gaps if gap < -OVERLAP_SLACK_NS),
        "<=" if cuda else None,
        0,
        note=f"a successor began over {OVERLAP_SLACK_NS // 1000} us before its holder ended",
    )
    ph.fig("hand_overs", len(gaps))
    ph.fig("hand_over_gap_median_us", statistics.median(gaps) / 1e3 if gaps else None)
    ph.fig("hand_over_gap_p90_us", sorted(gaps)[int(len(gaps) * 0.9)] / 1e3 if gaps else None)
    ph.details.update(window_s=(hi - lo) / 1e9, gaps_us=[g / 1e3 for g in gaps[:2000]])
    if cuda:
        dead_holder(ph, s)


def dead_holder(ph: Phase, s) -> None:
    """The successor of a holder that dies after its release, its tail on the device."""
    dying = [*s.args("spin", 5), "--last-ms", 3000, "--die"]
    ph.submit("dying", dying, stage="dead", options=s.mem("spin"))
    ph.submit("after", s.args("spin", 300), stage="dead", options=s.mem("spin"))
    ph.wait_ready(["dying", "after"])
    try:
        after = ph.run_stage("dead", ["after"])["after"]
    except (PhaseTimeout, JobFailed) as error:
        ph.fig("successor_after_dead_holder", 0, ">=", 1, note=str(error)[:300])
        return
    ph.fig("successor_after_dead_holder", 1, ">=", 1)
    spans = timed(after)
    longest = max((b[0] - a[1] for a, b in zip(spans, spans[1:])), default=None)
    ph.fig(
        "successor_longest_gap_ms",
        longest / 1e6 if longest is not None else None,
        note="about 3000: it waited for the dead holder's tail; about 0: the tail died with it",
    )

"""How soon a device's lanes must be looked at again when nothing happens: pure."""

from __future__ import annotations

import math

from gq import defaults
from gq.exec.lane.residents import Lane, ready_to_grant
from gq.exec.lane.standings import Standing


def due_in(lanes: list[Lane], now: float, max_hold: float) -> float:
    """Seconds until the lanes must be looked at again with no event (math.inf: not before
    one): a free lane a ready job waits for is kept for a job in its gap until then, or is
    free because the policy picks no one now, which it is asked again soon; a lease asked
    back inside an iteration is looked at again soon (its lock may come free); a hold (or a
    lease) others wait for, when its bound (``max_hold``) is up, or soon (the policy may
    come to prefer one of them)."""
    due = math.inf
    for lane in lanes:
        holder = lane.holder
        if holder is not None:
            if holder.standing is Standing.RECALLED:  # tried more rarely as it goes on
                asked = now - holder.recalled_at
                due = min(due, min(defaults.RECALL_POLL_MAX, max(defaults.RECALL_POLL, asked / 4)))
            if lane.contended_since is not None:
                due = min(due, max(0.0, lane.contended_since + max_hold - now))
            elif ready_to_grant(lane):
                # (a person's run of turns is asked back as its time is over)
                due = min(due, defaults.CONTENTION_POLL, lane.turns.left(now) or math.inf)
            continue
        if not ready_to_grant(lane):
            continue
        if lane.kept_until is not None:
            due = min(due, max(0.0, lane.kept_until - now))
        else:
            due = min(due, 0.01)
    return due

"""The lane's one table of moves (gq.exec.lane.standings.step): what may follow what for a job
resident on a lane, unit-tested like the policies."""

from __future__ import annotations

import pytest

from gq.exec.lane.standings import (
    HOLDS_LANE,
    TRANSITIONS,
    WANTS_LANE,
    Event,
    IllegalStep,
    Standing,
    step,
)

WORKER_EVENTS = (Event.ASK, Event.RELEASE)


@pytest.mark.parametrize("standing", list(Standing))
@pytest.mark.parametrize("event", WORKER_EVENTS)
def test_whatever_a_worker_says_in_any_standing_has_a_move(standing, event):
    """A worker's READY or Done is never an error of the host's: one that means nothing
    where the job stands changes nothing."""
    assert step(standing, event) in Standing


@pytest.mark.parametrize("standing", list(Standing))
def test_a_job_that_leaves_its_lane_is_idle_from_anywhere(standing):
    assert step(standing, Event.LEAVE) is Standing.IDLE


@pytest.mark.parametrize(
    "standing, event, after",
    [
        (Standing.IDLE, Event.ASK, Standing.WAITING),
        (Standing.WAITING, Event.GRANT, Standing.HOLDING),
        (Standing.WAITING, Event.LEASE, Standing.LEASED),
        (Standing.HOLDING, Event.RELEASE, Standing.IDLE),
        (Standing.LEASED, Event.RECALL, Standing.RECALLED),
        (Standing.RECALLED, Event.TAKEN_BACK, Standing.IDLE),
        (Standing.RECALLED, Event.RELEASE, Standing.IDLE),
        (Standing.HOLDING, Event.STOP, Standing.STOPPED),
        (Standing.RECALLED, Event.STOP, Standing.STOPPED),
        (Standing.STOPPED, Event.GRANT, Standing.HOLDING),
        (Standing.STOPPED, Event.RELEASE, Standing.IDLE),
        (Standing.STOPPED, Event.ASK, Standing.WAITING),  # its READY crossed the stop
        # What changes nothing: a duplicate READY, a Done never owed or already counted.
        (Standing.WAITING, Event.ASK, Standing.WAITING),
        (Standing.HOLDING, Event.ASK, Standing.HOLDING),
        (Standing.IDLE, Event.RELEASE, Standing.IDLE),
        (Standing.WAITING, Event.RELEASE, Standing.WAITING),
        (Standing.LEASED, Event.RELEASE, Standing.IDLE),  # it gave its lease back
        (Standing.RECALLED, Event.UNTAKEN, Standing.HOLDING),
    ],
)
def test_moves(standing, event, after):
    assert step(standing, event) is after


@pytest.mark.parametrize(
    "standing, event",
    [
        (Standing.IDLE, Event.GRANT),  # granted without asking
        (Standing.HOLDING, Event.GRANT),  # granted twice
        (Standing.LEASED, Event.LEASE),
        (Standing.IDLE, Event.RECALL),  # nothing to recall
        (Standing.HOLDING, Event.RECALL),
        (Standing.LEASED, Event.TAKEN_BACK),  # taken back without being asked back first
        (Standing.IDLE, Event.STOP),  # stopped inside an iteration it is not in
        (Standing.LEASED, Event.STOP),  # a lease is asked back before its job is stopped
    ],
)
def test_a_move_the_table_does_not_have_is_the_host_s_error(standing, event):
    with pytest.raises(IllegalStep, match=event.value):
        step(standing, event)


def test_holding_and_wanting_the_lane_are_apart():
    assert not HOLDS_LANE & WANTS_LANE
    # From every standing that holds the lane there is a way out that needs no grant.
    for standing in HOLDS_LANE:
        exits = {after for (before, _), after in TRANSITIONS.items() if before is standing}
        assert exits - HOLDS_LANE, standing

"""gq's fifo on several devices against a strict central FIFO queue (gq.sim.central): the
reference, worked out on paper, and the simulator measured against it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gq import policies
from gq.sim.central import central_fifo
from gq.sim.simulator import simulate
from gq.sim.traces import TraceJob, load

SHIPPED = Path(__file__).resolve().parent / "data" / "tiresias-60.csv"


def test_a_central_fifo_queue_starts_each_job_once_its_devices_are_free_in_order():
    """Three devices. A takes two; B's two come free only as A ends (10); C, one device,
    starts with B, not before it (strict order), beside it; D asks for four, gets all
    three once B and C have ended; E's start-up and gaps are part of its run."""
    jobs = [
        TraceJob(1, 0.0, 10.0, 10, gpus=2),
        TraceJob(2, 1.0, 5.0, 5, gpus=2),
        TraceJob(3, 2.0, 3.0, 3),
        TraceJob(4, 3.0, 1.0, 1, gpus=4),
        TraceJob(5, 4.0, 2.0, 2, startup=1.5, gap=0.25),
    ]
    assert central_fifo(jobs, 3) == {
        1: (0.0, 10.0),
        2: (10.0, 15.0),
        3: (10.0, 13.0),
        4: (15.0, 16.0),
        5: (16.0, 20.0),
    }
    assert central_fifo(jobs[:1], 1) == {1: (0.0, 10.0)}  # asked for more than there are
    with pytest.raises(ValueError):
        central_fifo(jobs, 0)


def test_a_job_waiting_behind_another_counts_its_whole_run_where_it_waits():
    """Two devices, fifo, no backfill. A 100 s job binds behind a 60 s one and waits there
    59 s. Its run alone taken as a time limit from its placement made it seem to end 59 s
    sooner than it would: a 10 s job arriving at 70 s was bound behind it (ending at 170)
    rather than behind the 120 s job on the other device (130, as a central FIFO queue
    starts it), moves or none. Its whole run counted, every job ends as the central
    queue's does."""
    jobs = [
        TraceJob(1, 0.0, 120.0, 120),
        TraceJob(2, 0.0, 60.0, 60),
        TraceJob(3, 1.0, 100.0, 100),
        TraceJob(4, 70.0, 10.0, 10),
    ]
    central = {job_id: end for job_id, (_, end) in central_fifo(jobs, 2).items()}
    assert central == {1: 120.0, 2: 60.0, 3: 160.0, 4: 130.0}
    for margin in (5.0, 1e6):
        result = simulate(jobs, policies.make("fifo"), gpus=2, backfill=False, move_margin=margin)
        assert {run.job.id: run.end for run in result.runs} == pytest.approx(central)


def test_fifo_without_backfill_is_strict_fifo_on_a_node_of_whole_device_and_shared_jobs():
    """The shipped 60-job trace (1 to 8 GPUs) on 8, 4 and 2 devices: with late binding no
    job gets its first iteration before, or after, the central FIFO queue would start it
    (each job holds its devices alone), moves or none."""
    jobs = load(SHIPPED)
    for gpus in (8, 4, 2):
        reference = {job_id: start for job_id, (start, _) in central_fifo(jobs, gpus).items()}
        for margin in (0.0, 5.0, 1e6):
            result = simulate(
                jobs, policies.make("fifo"), gpus=gpus, backfill=False, move_margin=margin
            )
            first: dict[int, float] = {}
            for piece in result.slices:
                first[piece.job] = min(first.get(piece.job, math.inf), piece.start)
            assert first == pytest.approx(reference), (gpus, margin)

"""Unit tests of admission: the Salus memory condition, caps, exclusivity, GPU counts,
placement by load and EASY backfill."""

from __future__ import annotations

import math

from gq.daemon.scheduling import admission
from gq.daemon.scheduling.admission import DeviceLoad, Footprint, LaneLoad, Request


def place(requests, devices, **kwargs):
    return admission.place(requests, devices, **kwargs).placements


G = 1 << 30


def cpu(capacity=16 * G, lanes=1, max_resident=4) -> DeviceLoad:
    return DeviceLoad(
        "cpu", False, [LaneLoad(capacity // lanes) for _ in range(lanes)], max_resident
    )


def gpu(index, capacity=80 * G, max_resident=4) -> DeviceLoad:
    return DeviceLoad(f"gpu{index}", True, [LaneLoad(capacity)], max_resident, index=index)


def test_salus_condition_sums_persistent_and_takes_max_ephemeral():
    lane = LaneLoad(10 * G, [Footprint(2 * G, 4 * G), Footprint(2 * G, 3 * G)])
    assert lane.fits(Footprint(2 * G, 2 * G))  # 6 persistent + max(4, 3, 2) = 10
    assert not lane.fits(Footprint(2 * G, 5 * G))  # 6 + 5 = 11
    assert not lane.fits(Footprint(3 * G, 0))  # 7 + 4 = 11


def test_jobs_placed_in_order_until_memory_runs_out_without_backfill():
    requests = [
        Request(1, 1, Footprint(10 * G)),
        Request(2, 1, Footprint(10 * G)),
        Request(3, 1, Footprint(1 * G)),
    ]
    placed = place(requests, [cpu()])
    assert [p.job_id for p in placed] == [1]  # job 3 would fit but waits behind job 2


def test_resident_cap():
    requests = [Request(i, 1, Footprint()) for i in range(5)]
    assert [p.job_id for p in place(requests, [cpu(max_resident=3)])] == [0, 1, 2]


def test_lanes_spread_jobs():
    placed = place([Request(i, 1, Footprint()) for i in range(4)], [cpu(lanes=2)])
    assert sorted(p.lane for p in placed) == [0, 0, 1, 1]


def test_exclusive_needs_an_empty_device_and_then_keeps_it():
    busy = cpu()
    busy.residents = 1
    assert place([Request(1, 1, Footprint(), exclusive=True)], [busy]) == []
    free = cpu()
    placed = place([Request(1, 1, Footprint(), exclusive=True), Request(2, 1, Footprint())], [free])
    assert [p.job_id for p in placed] == [1]


def test_multi_gpu_jobs_take_whole_devices_and_cpu_jobs_use_cpu():
    devices = [gpu(0), gpu(1), gpu(2), cpu()]
    devices[0].residents = 1
    placed = place(
        [Request(1, 2, Footprint()), Request(2, 0, Footprint()), Request(3, 1, Footprint())],
        devices,
    )
    by_job = {p.job_id: p.devices for p in placed}
    assert by_job[1] == ("gpu1", "gpu2")
    assert by_job[2] == ("cpu",)
    assert by_job[3] == ("gpu0",)


def test_without_gpus_the_cpu_device_serves_gpu_jobs():
    placed = place([Request(1, 1, Footprint())], [cpu()])
    assert placed[0].devices == ("cpu",)


def test_single_gpu_jobs_go_to_the_least_loaded_gpu():
    devices = [gpu(0), gpu(1)]
    devices[0].residents = 2
    assert place([Request(1, 1, Footprint())], devices)[0].devices == ("gpu1",)


def test_a_shared_job_goes_where_it_leaves_the_most_memory_then_fewest_residents():
    devices = [gpu(0), gpu(1), gpu(2)]
    devices[0].lanes[0].footprints.append(Footprint(60 * G))
    devices[0].residents = 1
    devices[1].lanes[0].footprints += [Footprint(5 * G), Footprint(5 * G)]
    devices[1].residents = 2
    devices[2].lanes[0].footprints.append(Footprint(10 * G))
    devices[2].residents = 1
    # gpu1 and gpu2 both leave 70G free; gpu2 has fewer jobs
    assert place([Request(1, 1, Footprint(G))], devices)[0].devices == ("gpu2",)


def test_whole_device_jobs_leave_the_largest_contiguous_free_set():
    assert place([Request(1, 2, Footprint())], [gpu(i) for i in range(4)])[0].devices == (
        "gpu0",
        "gpu1",
    )
    devices = [gpu(i) for i in range(6)]
    devices[2].residents = 1  # free: 0 1 | 3 4 5
    assert place([Request(1, 2, Footprint())], devices)[0].devices == ("gpu0", "gpu1")


def _busy_node(now: float, ends_at: float) -> list[DeviceLoad]:
    devices = [gpu(0), gpu(1)]
    devices[0].residents, devices[0].free_at = 1, ends_at  # a job with a time limit runs
    return devices


def test_easy_backfill_runs_short_jobs_in_the_hole_and_never_delays_the_blocked_one():
    now = 1000.0
    requests = [
        Request(1, 2, Footprint()),  # needs both devices: blocked until 1060
        Request(2, 1, Footprint(), time_limit=30),  # ends at 1030: fits the hole
        Request(3, 1, Footprint(), time_limit=120),  # would end at 1120: waits
        Request(4, 1, Footprint()),
    ]  # no limit: never backfilled onto the reservation
    outcome = admission.place(requests, _busy_node(now, now + 60), now=now)
    assert [(p.job_id, p.devices) for p in outcome.placements] == [(2, ("gpu1",))]
    assert outcome.reserved_start == now + 60 and outcome.reserved == ("gpu0", "gpu1")
    assert outcome.reasons == {1: admission.RESOURCES, 3: admission.PRIORITY, 4: admission.NO_LIMIT}
    without = admission.place(requests, _busy_node(now, now + 60), now=now, backfill=False)
    assert without.placements == [] and without.reasons[2] == admission.PRIORITY


def test_no_backfill_onto_a_reservation_whose_start_is_unknown():
    now = 10.0
    outcome = admission.place(
        [Request(1, 2, Footprint()), Request(2, 1, Footprint(), time_limit=1)],
        _busy_node(now, math.inf),
        now=now,
    )
    assert outcome.placements == [] and outcome.reserved_start == math.inf


def test_backfill_may_use_devices_the_blocked_job_does_not_wait_for():
    devices = [gpu(0), gpu(1), gpu(2)]
    devices[0].residents, devices[0].free_at = 1, 50.0
    devices[1].residents, devices[1].free_at = 1, 500.0
    outcome = admission.place(
        [Request(1, 2, Footprint()), Request(2, 1, Footprint())], devices, now=0.0
    )
    # job 1 will get gpu2 and gpu0 (free at 50); gpu1 is not reserved: job 2 may go there,
    # although it has no time limit
    assert outcome.reserved == ("gpu0", "gpu2")
    assert [(p.job_id, p.devices) for p in outcome.placements] == [(2, ("gpu1",))]


def test_a_job_placed_in_the_same_pass_counts_in_the_reservation():
    # Job 1 takes gpu0 until 1100; job 2 (both devices) then waits for 1100, not for now,
    # so job 3 (ends at 1050) may use gpu1 meanwhile.
    now = 1000.0
    outcome = admission.place(
        [
            Request(1, 1, Footprint(), time_limit=100),
            Request(2, 2, Footprint()),
            Request(3, 1, Footprint(), time_limit=50),
        ],
        [gpu(0), gpu(1)],
        now=now,
    )
    assert outcome.reserved_start == now + 100
    assert [(p.job_id, p.devices) for p in outcome.placements] == [(1, ("gpu0",)), (3, ("gpu1",))]


def test_host_memory_and_cpus_are_reserved_on_the_node_as_slurm_counts_them():
    devices = [
        DeviceLoad("gpu0", True, [LaneLoad(8 << 30)], max_resident=8, index=0),
        DeviceLoad("gpu1", True, [LaneLoad(8 << 30)], max_resident=8, index=1),
    ]
    node = admission.NodeRoom(memory=10 << 30, cpus=4)
    requests = [
        Request(1, 1, Footprint(), host_mem=6 << 30, cpus=2),
        Request(2, 1, Footprint(), host_mem=6 << 30),  # 12G of 10G: waits
        Request(3, 1, Footprint(), cpus=2),
        Request(4, 1, Footprint(), cpus=1),  # 5 of 4 CPUs: waits
        Request(5, 1, Footprint()),
    ]  # reserves neither: never held by them
    outcome = admission.place(requests, devices, node=node)
    assert [p.job_id for p in outcome.placements] == [1, 3, 5]
    assert outcome.reasons == {2: admission.NODE_ROOM, 4: admission.NODE_ROOM}
    assert (node.memory, node.cpus) == (4 << 30, 0)
    # Its devices are not what a job held by the node waits for: nothing is reserved.
    assert outcome.reserved == ()


def test_a_gpu_type_keeps_a_job_to_its_devices():
    devices = [
        DeviceLoad("gpu0", True, [LaneLoad(8 << 30)], max_resident=8, index=0),
        DeviceLoad("gpu1", True, [LaneLoad(8 << 30)], max_resident=8, index=1),
    ]
    outcome = admission.place([Request(1, 1, Footprint(), only=frozenset({"gpu1"}))], devices)
    assert [p.devices for p in outcome.placements] == [("gpu1",)]


def test_a_shared_job_goes_where_it_starts_soonest_or_waits_for_a_device_that_frees_first():
    """fifo: a newcomer waits for the residents before it. Bound behind a long job while
    another device's short job ends first, it would start later than in the queue."""
    long_lane = LaneLoad(80 * G, [Footprint()], starts_in=99.0)
    short_lane = LaneLoad(80 * G, [Footprint()], starts_in=9.0)
    devices = [
        DeviceLoad("gpu0", True, [long_lane], 4, index=0, residents=1),
        DeviceLoad("gpu1", True, [short_lane], 4, index=1, residents=1),
    ]
    assert [p.devices for p in place([Request(3, 1, Footprint())], devices)] == [("gpu1",)]
    full = [
        DeviceLoad("gpu0", True, [LaneLoad(80 * G, [Footprint()], 99.0)], 4, index=0, residents=1),
        DeviceLoad(
            "gpu1", True, [LaneLoad(80 * G, [Footprint()] * 4, 9.0)], 4, index=1, residents=4
        ),
    ]  # at its resident cap, its jobs end first
    outcome = admission.place([Request(3, 1, Footprint())], full)
    assert outcome.placements == [] and outcome.reasons == {3: admission.RESOURCES}
    unknown = [
        DeviceLoad(
            f"gpu{i}", True, [LaneLoad(80 * G, [Footprint()], math.inf)], 4, index=i, residents=1
        )
        for i in range(2)
    ]
    assert [p.devices for p in place([Request(3, 1, Footprint())], unknown)] == [("gpu0",)]


def test_an_unstarted_resident_moves_only_for_a_start_sooner_by_the_margin():
    devices = [
        DeviceLoad(
            "gpu0", True, [LaneLoad(80 * G, [Footprint()] * 2, 99.0)], 4, index=0, residents=2
        ),
        DeviceLoad("gpu1", True, [LaneLoad(80 * G, [Footprint()], 3.0)], 4, index=1, residents=1),
    ]
    behind = admission.Unstarted(7, "gpu0", Footprint(), starts_in=90.0, gpus=1, only=None)
    near = admission.Unstarted(8, "gpu0", Footprint(), starts_in=6.0, gpus=1, only=None)
    assert admission.move([near, behind], devices, margin=5.0) == 7  # gains 87 s
    assert admission.move([near], devices, margin=5.0) is None  # 3 s sooner: stays
    devices[1].residents = 4  # no room there now
    assert admission.move([behind], devices, margin=5.0) is None


def test_an_unstarted_resident_moves_only_to_a_device_it_may_use():
    """Not from a GPU to the node's cpu device, nor off the devices its type or -w names:
    admission would place it back where it was, and the next pass move it again."""
    devices = [
        DeviceLoad(
            "gpu0", True, [LaneLoad(80 * G, [Footprint()] * 2, 99.0)], 4, index=0, residents=2
        ),
        DeviceLoad("gpu1", True, [LaneLoad(80 * G, [Footprint()], 3.0)], 4, index=1, residents=1),
        DeviceLoad("cpu", False, [LaneLoad(80 * G)], 4, index=2),
    ]
    pinned = admission.Unstarted(7, "gpu0", Footprint(), 90.0, gpus=1, only=frozenset({"gpu0"}))
    assert admission.move([pinned], devices, margin=5.0) is None
    devices[1].residents = 4  # gpu1 full: the empty cpu device starts it at once
    free = admission.Unstarted(7, "gpu0", Footprint(), 90.0, gpus=1, only=None)
    assert admission.move([free], devices, margin=5.0) is None
    on_cpu = admission.Unstarted(8, "cpu", Footprint(), 90.0, gpus=0, only=None)
    devices[2].lanes[0].starts_in, devices[1].residents = 90.0, 1
    assert admission.move([on_cpu], devices, margin=5.0) is None  # -G 0: not onto a GPU
    assert admission.move([free], devices, margin=5.0) == 7  # gpu1 has room again


def test_a_user_takes_no_more_than_their_part_of_the_slots_while_others_wait():
    """Four slots, two users waiting: ann's first two jobs go in, her third waits behind
    bob's (its reason says why) and so does her fourth (her order kept), bob's goes in."""
    from gq.daemon.scheduling.residency import SLOTS

    requests = [Request(i, 1, Footprint(G), user="ann") for i in (1, 2, 3, 4)]
    requests.append(Request(5, 1, Footprint(G), user="bob"))
    outcome = admission.place(requests, [cpu(max_resident=4)])
    assert [p.job_id for p in outcome.placements] == [1, 2, 5]
    assert outcome.reasons == {3: SLOTS, 4: SLOTS}
    # With nobody else waiting, the slots are all hers.
    alone = admission.place(requests[:4], [cpu(max_resident=4)])
    assert [p.job_id for p in alone.placements] == [1, 2, 3, 4]


def test_an_idle_resident_of_a_user_over_their_part_gives_its_slot_back():
    from gq.daemon.scheduling.residency import Resident, Waiting, slot_to_give_back

    residents = [Resident(i, "ann", "cpu", idle_for=float(i), may_yield=True) for i in (1, 2, 3)]
    residents.append(Resident(4, "ann", "cpu", idle_for=99.0, may_yield=False))  # interactive
    bob = [Waiting("bob", frozenset({"cpu"}))]
    chosen = slot_to_give_back(bob, residents, slots=4, idle_after=2.0)
    assert chosen is not None and chosen.job_id == 3  # the longest idle that may yield
    assert slot_to_give_back(bob, residents, slots=4, idle_after=10.0) is None  # none so idle
    assert slot_to_give_back(bob, residents, slots=5, idle_after=2.0) is None  # a slot is free
    assert slot_to_give_back(bob, residents, slots=4, idle_after=math.inf) is None  # never
    mine = [Waiting("ann", frozenset({"cpu"}))]
    assert slot_to_give_back(mine, residents, slots=4, idle_after=2.0) is None  # her own
    even = [Resident(1, "ann", "cpu", 50.0, True), Resident(2, "bob", "cpu", 50.0, True)]
    three = [Waiting("cat", frozenset({"cpu"}))]
    assert slot_to_give_back(three, even, slots=2, idle_after=2.0) is None  # within parts
    coming = [*residents, Resident(5, "ann", "cpu", 0.0, False, yielding=True)]
    assert slot_to_give_back(bob, coming, slots=5, idle_after=2.0) is None  # one on its way


def test_slots_a_part_leaves_over_go_to_those_who_wait_not_to_nobody():
    """Four slots, three users waiting with two jobs each: a part is one slot, and the
    fourth goes to the first of them whose next job comes, not left empty."""
    requests = [
        Request(10 * u + i, 1, Footprint(G), user=name)
        for i in (1, 2)
        for u, name in enumerate(("ann", "bob", "cat"))
    ]
    outcome = admission.place(requests, [cpu(max_resident=4)])
    assert [p.job_id for p in outcome.placements] == [1, 11, 21, 2]


def test_a_user_waiting_for_another_device_or_the_node_takes_no_slot_part_here():
    """Only a job that could use a slot here counts as another user waiting here: bob's,
    pinned to a full emu1, or waiting for the node's host memory, leave ann emu0 whole."""
    devices = [cpu(max_resident=2), cpu(max_resident=2)]
    devices[0].name, devices[1].name, devices[1].index = "emu0", "emu1", 1
    devices[1].residents, devices[1].by_user = 2, {"cat": 2}
    ann = [Request(i, 1, Footprint(G), only=frozenset({"emu0"}), user="ann") for i in (1, 2)]
    bob = Request(9, 1, Footprint(G), only=frozenset({"emu1"}), user="bob")
    outcome = admission.place([bob, *ann], devices)
    assert sorted(p.job_id for p in outcome.placements) == [1, 2]
    node = admission.NodeRoom(memory=8 * G, cpus=64)
    greedy = Request(9, 1, Footprint(G), user="bob", host_mem=64 * G)
    mine = [Request(i, 1, Footprint(G), user="ann") for i in (1, 2)]
    alone = admission.place([greedy, *mine], [cpu(max_resident=2)], node=node)
    assert sorted(p.job_id for p in alone.placements) == [1, 2]

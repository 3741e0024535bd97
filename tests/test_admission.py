"""Unit tests of admission: the Salus memory condition, caps, exclusivity, GPU counts."""

from __future__ import annotations

from gq.daemon.admission import DeviceLoad, Footprint, LaneLoad, Request, place

G = 1 << 30


def cpu(capacity=16 * G, lanes=1, max_resident=4) -> DeviceLoad:
    return DeviceLoad("cpu", False, [LaneLoad(capacity // lanes) for _ in range(lanes)],
                      max_resident)


def gpu(index, capacity=80 * G, max_resident=4) -> DeviceLoad:
    return DeviceLoad(f"gpu{index}", True, [LaneLoad(capacity)], max_resident)


def test_salus_condition_sums_persistent_and_takes_max_ephemeral():
    lane = LaneLoad(10 * G, [Footprint(2 * G, 4 * G), Footprint(2 * G, 3 * G)])
    assert lane.fits(Footprint(2 * G, 2 * G))  # 6 persistent + max(4, 3, 2) = 10
    assert not lane.fits(Footprint(2 * G, 5 * G))  # 6 + 5 = 11
    assert not lane.fits(Footprint(3 * G, 0))  # 7 + 4 = 11


def test_jobs_placed_in_order_until_memory_runs_out_without_backfill():
    requests = [Request(1, 1, Footprint(10 * G)), Request(2, 1, Footprint(10 * G)),
                Request(3, 1, Footprint(1 * G))]
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
    placed = place([Request(1, 1, Footprint(), exclusive=True), Request(2, 1, Footprint())],
                   [free])
    assert [p.job_id for p in placed] == [1]


def test_multi_gpu_jobs_take_whole_devices_and_cpu_jobs_use_cpu():
    devices = [gpu(0), gpu(1), gpu(2), cpu()]
    devices[0].residents = 1
    placed = place([Request(1, 2, Footprint()), Request(2, 0, Footprint()),
                    Request(3, 1, Footprint())], devices)
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

"""The CUDA paths end to end, on a machine with an NVIDIA GPU: NVML discovery and sampling,
memory figures from torch.cuda, two jobs sharing one lane (parked workers give back cached
memory), a 2-GPU job's CUDA_VISIBLE_DEVICES, and the safety condition refusing a job that
cannot fit. Run them with ``pytest -m gpu``; elsewhere they are skipped, saying why."""

from __future__ import annotations

import json
import os

import pytest

from conftest import ROOT, gq, gq_ok, job, submit, wait_for, wait_state


def _cuda() -> bool:
    """Whether torch sees a CUDA device; torch is imported only where the driver's device
    node is there (importing it costs every test worker a second and a half to collect)."""
    if not os.path.exists("/dev/nvidiactl"):
        return False
    import torch

    return torch.cuda.is_available()


NO_GPU = "no CUDA device (these run on a GPU machine: pytest -m gpu)"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason=NO_GPU)]

CUDA_TRAIN = str(ROOT / "tests" / "zoo" / "cuda_train.py")


def output(tmp_path, job_id: int) -> dict:
    return json.loads((tmp_path / f"gq-{job_id}.out").read_text().strip().splitlines()[-1])


def test_nvml_finds_the_gpus_and_samples_them(daemon):
    import torch

    info = json.loads(gq_ok("info", "--json"))
    gpus = [d for d in info["devices"] if d["kind"] == "cuda"]
    assert len(gpus) == torch.cuda.device_count() or any("-mig" in d["name"] for d in gpus)
    first = gpus[0]
    assert first["uuid"] and first["memory_total"] > 0
    reading = wait_for(
        lambda: json.loads(gq_ok("info", "--json"))["devices"][0]["reading"],
        10,
        what="a first sample",
    )
    assert reading["source"] == "nvml" and reading["memory_total"] == first["memory_total"]
    assert reading["temperature"] is not None and reading["power"] is not None


def test_a_job_reports_its_cuda_memory(daemon, tmp_path):
    job_id = submit(CUDA_TRAIN, "--mb", "256", "--steps", "30")
    done = wait_state(job_id, "COMPLETED", timeout=120)
    assert done["device"].startswith("gpu")
    assert done["mem_persistent"] >= 200 << 20 and done["mem_peak"] >= done["mem_persistent"]
    result = output(tmp_path, job_id)
    assert result["count"] == 1 and result["allocated"] >= 200 << 20


def test_two_jobs_share_a_lane_and_parked_ones_give_back_cached_memory(daemon, tmp_path):
    """Both jobs' models are on the GPU before either loop begins (each waits for the start
    file with its weights allocated: NVML sees both processes), then they share its lane."""
    go = tmp_path / "go"
    ids = [
        submit(
            "-G",
            "1",
            "--gpu-mem",
            "2G",
            CUDA_TRAIN,
            "--mb",
            "512",
            "--steps",
            "200",
            "--start-file",
            str(go),
        )
        for _ in range(2)
    ]
    devices = [wait_state(i, "RUNNING", timeout=120)["device"] for i in ids]
    if devices[0] != devices[1]:
        pytest.skip("the two jobs went to different GPUs: nothing shares a lane")

    def both_on_the_device():
        reading = json.loads(gq_ok("info", "--json"))["devices"]
        mine = next(d for d in reading if d["name"] == devices[0])["reading"]
        return mine and {p["job"] for p in mine["processes"]} >= set(ids)

    wait_for(both_on_the_device, 120, what="NVML to see both jobs' processes")
    go.touch()
    for job_id in ids:
        wait_state(job_id, "COMPLETED", timeout=300)
    for job_id in ids:
        # Allocated weights stay; the cache beyond them was given back while parked.
        result = output(tmp_path, job_id)
        assert result["reserved"] - result["allocated"] < 256 << 20


def test_a_two_gpu_job_sees_its_two_devices(daemon, tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    job_id = submit("-G", "2", CUDA_TRAIN, "--mb", "64", "--steps", "5")
    done = wait_state(job_id, "COMPLETED", timeout=120)
    assert len(done["device"].split(",")) == 2
    result = output(tmp_path, job_id)
    assert result["count"] == 2 and len(result["visible"].split(",")) == 2


def test_a_job_larger_than_any_gpu_is_refused(daemon):
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    result = gq("submit", "--mem", f"{(total * 2) >> 30}G", CUDA_TRAIN)
    assert result.code == 2 and "more than any device" in result.err


def test_the_per_process_fraction_caps_a_job_at_its_declaration(daemon, tmp_path):
    """With --gpu-mem 1G a job cannot take 2G more of a GPU that has it free: its own
    allocation fails at its cap (torch's OutOfMemoryError), and with --oom fail it fails
    saying what it held and asked for, its figure as it was (a later gq requeue must not
    bring back a figure raised past what it declared)."""
    job_id = submit(
        "--gpu-mem", "1G", "--oom", "fail", CUDA_TRAIN, "--mb", "64", "--grow-mb", "2048"
    )
    failed = wait_state(job_id, "FAILED", timeout=120)
    assert failed["reason"].startswith("OutOfMemory (needs ") and "--oom fail" in failed["reason"]
    assert failed["reason"].startswith("OutOfMemory (needs 2.") and failed["ooms"] == 1
    assert failed["mem"] == 1 << 30 and failed["mem_basis"] == "declared"
    assert "OutOfMemoryError" in (tmp_path / f"gq-{job_id}.out").read_text()


def test_an_oom_in_one_job_leaves_its_neighbours_losses_as_alone_and_it_is_readmitted(
    daemon, tmp_path
):
    alone = submit("--gpu-mem", "2G", CUDA_TRAIN, "--mb", "256", "--steps", "200")
    wait_state(alone, "COMPLETED", timeout=180)
    solo = output(tmp_path, alone)["losses"]
    neighbour = submit("--gpu-mem", "2G", CUDA_TRAIN, "--mb", "256", "--steps", "200")
    grower = submit("--gpu-mem", "1G", CUDA_TRAIN, "--mb", "64", "--grow-mb", "2048")
    requeued = wait_for(
        lambda: (info := job(grower))["ooms"] == 1 and info,
        120,
        what="the grower to run out of memory",
    )
    assert requeued["mem"] >= 2 << 30 and requeued["mem_basis"] == "raised"
    again = wait_state(grower, "COMPLETED", timeout=180)
    assert again["run_count"] == 2
    wait_state(neighbour, "COMPLETED", timeout=180)
    assert output(tmp_path, neighbour)["losses"] == solo


def test_a_probed_job_is_capped_at_its_figure_and_requeued_past_it(daemon, tmp_path):
    """A job that declares nothing is probed; its figure is then its cap: growing past it
    fails its own allocation, and it goes back to the queue with its figure raised."""
    # About 30 steps a second on an H200 (deterministic kernels, a loss read every step):
    # the probe's figure comes within the first 200 steps, long before the growth.
    job_id = submit(
        CUDA_TRAIN, "--mb", "256", "--steps", "1200", "--grow-mb", "2048", "--grow-at", "600"
    )
    measured = wait_for(
        lambda: (info := job(job_id))["mem_basis"] == "measured" and info,
        120,
        what="the probe's figure",
    )
    requeued = wait_for(
        lambda: (info := job(job_id))["ooms"] == 1 and info,
        120,
        what="the job to run out at its probed cap",
    )
    assert measured["mem"] < 2 << 30  # the probe saw the model, not the growth
    assert requeued["mem"] >= 2 << 30 and requeued["mem_basis"] == "raised"
    assert wait_state(job_id, "COMPLETED", timeout=180)["run_count"] == 2


def test_a_job_that_lifts_its_own_cap_is_flagged_mem(daemon, tmp_path):
    """A script may raise its own per-process fraction past its figure: nothing ends it, but
    its owner sees MEM! in gq status and gq show, and the daemon logs it."""
    job_id = submit(
        "--gpu-mem",
        "512M",
        CUDA_TRAIN,
        "--mb",
        "64",
        "--steps",
        "1000000",
        "--lift-cap",
        "--grow-mb",
        "1024",
        "--grow-at",
        "5",
    )
    over = wait_for(
        lambda: (info := job(job_id))["mem_over"] and info,
        120,
        what="the job measured over its figure",
    )
    assert over["mem_peak"] > over["mem"] and over["state"] == "RUNNING"
    assert any(
        line.split()[0] == str(job_id) and "MEM!" in line for line in gq_ok("status").splitlines()
    )
    assert "MEM! its worker claims" in gq_ok("show", str(job_id))
    wait_for(lambda: "(MEM!)" in daemon.log(), 10, what="the daemon's log line")
    gq_ok("cancel", str(job_id))

"""Seeing the node: device sampling, placement by measured load, the thermal and power
guard, Prometheus metrics, gq top and per-job figures; end to end with emulated devices,
plus the pure cores (guard, placement keys) and the NVML paths against a fake NVML."""

from __future__ import annotations

import glob
import json
import os
import pty
import select
import socket
import subprocess
import sys
import types
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from gq.daemon import devices
from gq.daemon.monitoring import sampling
from gq.daemon.monitoring.guard import Guard, Limits
from gq.daemon.scheduling import admission
from gq.messages import DeviceReading

from conftest import (
    KERNEL_LOOP,
    gq,
    gq_ok,
    job,
    submit,
    submit_resident,
    wait_for,
    wait_state,
    write_script,
)


# ----- the guard (pure) -----------------------------------------------------------------
def reading(temperature=None, power=None) -> DeviceReading:
    return DeviceReading(time=0.0, source="recorded", temperature=temperature, power=power)


def test_guard_holds_above_the_limit_and_releases_only_under_the_hysteresis():
    guard = Guard(Limits(max_temp=80, max_power=300))
    assert guard.update("gpu0", reading(79, 250)) is False and "gpu0" not in guard.held
    assert guard.update("gpu0", reading(81, 250)) is True
    assert guard.held["gpu0"] == "gpu0 too hot: 81 C (--max-temp 80); admits again at 75 C"
    assert guard.update("gpu0", reading(78, 250)) is False  # under the limit, not the margin
    assert "78 C" in guard.held["gpu0"]
    assert guard.update("gpu0", reading(75, 250)) is True and "gpu0" not in guard.held
    assert guard.update("gpu0", reading(70, 301)) is True
    assert guard.held["gpu0"].startswith("gpu0 over its power limit: 301 W (--max-power 300)")
    assert guard.update("gpu0", reading(70, 280)) is False  # 270 W is the margin
    assert guard.update("gpu0", reading(70, 269)) is True


def test_guard_without_a_figure_or_a_limit_holds_nothing():
    assert Guard(Limits(max_temp=80)).update("cpu", reading(None, 900)) is False
    assert Guard(Limits()).update("cpu", reading(120, 900)) is False
    assert not Limits().any and Limits(max_power=1).any


# ----- placement keys (pure) ------------------------------------------------------------
def load(
    name: str,
    index: int,
    residents: int = 0,
    utilization: float = 0.0,
    held: str | None = None,
    links: tuple[int, ...] = (),
) -> admission.DeviceLoad:
    return admission.DeviceLoad(
        name=name,
        gpu=True,
        index=index,
        residents=residents,
        lanes=[admission.LaneLoad(1 << 30)],
        max_resident=4,
        utilization=utilization,
        held=held,
        links=links,
    )


def test_a_shared_job_goes_to_the_less_busy_device_when_headroom_and_residents_tie():
    loads = [load("gpu0", 0, 1, utilization=95.0), load("gpu1", 1, 1, utilization=5.0)]
    outcome = admission.place([admission.Request(1, 1, admission.Footprint())], loads)
    assert outcome.placements[0].devices == ("gpu1",)
    # Fewer residents still come first.
    loads = [
        load("gpu0", 0, 1, utilization=0.0),
        load("gpu1", 1, 2, utilization=0.0),
        load("gpu2", 2, 0, utilization=99.0),
    ]
    outcome = admission.place([admission.Request(1, 1, admission.Footprint())], loads)
    assert outcome.placements[0].devices == ("gpu2",)


def test_a_held_device_takes_no_job_and_the_waiting_jobs_say_why():
    why = "gpu0 too hot: 91 C (--max-temp 80); admits again at 75 C"
    outcome = admission.place(
        [
            admission.Request(1, 1, admission.Footprint()),
            admission.Request(2, 1, admission.Footprint()),
        ],
        [load("gpu0", 0, held=why)],
    )
    assert outcome.placements == []
    assert outcome.reasons == {1: f"Resources ({why})", 2: f"Priority ({why})"}
    # Another device takes the job instead.
    outcome = admission.place(
        [admission.Request(1, 1, admission.Footprint())],
        [load("gpu0", 0, held=why), load("gpu1", 1, residents=3)],
    )
    assert outcome.placements[0].devices == ("gpu1",)


def test_a_two_device_job_takes_the_closest_linked_pair():
    # gpu0-gpu2 share a switch (10); every other pair crosses the host bridge (30).
    level = {(0, 2): 10, (2, 0): 10}
    links = lambda i: tuple(0 if i == j else level.get((i, j), 30) for j in range(4))  # noqa: E731
    loads = [load(f"gpu{i}", i, links=links(i)) for i in range(4)]
    loads[1].residents, loads[1].exclusive = 1, True  # busy: {0, 2, 3} are empty
    outcome = admission.place([admission.Request(1, 2, admission.Footprint())], loads)
    assert outcome.placements[0].devices == ("gpu0", "gpu2")
    # Without topology the least spread pair wins.
    plain = [load(f"gpu{i}", i) for i in range(4)]
    plain[1].residents, plain[1].exclusive = 1, True
    outcome = admission.place([admission.Request(1, 2, admission.Footprint())], plain)
    assert outcome.placements[0].devices == ("gpu2", "gpu3")


# ----- NVML, against a fake of nvidia-ml-py's module --------------------------------------
class FakeNvmlError(Exception):
    pass


def fake_nvml(job_pid: int) -> types.SimpleNamespace:
    """Two GPUs: gpu0 whole (a foreign process holds 1 GiB on it, one gq job 2 GiB), gpu1
    in MIG mode with instances in slots 0 and 2; they share one PCIe switch."""
    boards = {0: "board0", 1: "board1"}
    mig = {("board1", 0): "mig-a", ("board1", 2): "mig-b"}
    uuids = {"board0": "GPU-0000", "board1": "GPU-1111", "mig-a": "MIG-aaaa", "mig-b": "MIG-bbbb"}

    def not_supported(*_):
        raise FakeNvmlError("Not Supported")

    def mig_handle(board, slot):
        if (board, slot) not in mig:
            raise FakeNvmlError("Not Found")
        return mig[board, slot]

    def memory(handle):
        total = {"board0": 80 << 30, "board1": 80 << 30, "mig-a": 10 << 30, "mig-b": 20 << 30}
        return types.SimpleNamespace(
            total=total[handle], used=3 << 30, free=total[handle] - (3 << 30)
        )

    def utilization(handle):
        if handle.startswith("mig"):
            not_supported()
        return types.SimpleNamespace(gpu=87, memory=40)

    def processes(handle):
        if handle != "board0":
            return []
        return [
            types.SimpleNamespace(pid=job_pid, usedGpuMemory=2 << 30),
            types.SimpleNamespace(pid=999999, usedGpuMemory=1 << 30),
        ]

    return types.SimpleNamespace(
        NVMLError=FakeNvmlError,
        NVML_DEVICE_MIG_ENABLE=1,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlClocksThrottleReasonGpuIdle=1,
        nvmlClocksThrottleReasonSwPowerCap=4,
        nvmlClocksThrottleReasonHwThermalSlowdown=0x40,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: boards[i],
        nvmlDeviceGetHandleByUUID=lambda u: next(h for h, v in uuids.items() if v == u),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: uuids[h],
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetMigMode=lambda h: (1, 1) if h == "board1" else not_supported(),
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 10,
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetPowerUsage=lambda h: 312_500,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 4 | 0x40,
        nvmlDeviceGetTemperature=lambda h, sensor: 71,
        nvmlDeviceGetClockInfo=lambda h, c: 1980,
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: 0,
        nvmlDeviceGetComputeRunningProcesses=processes,
    )


def test_nvml_discovery_sampling_mig_and_the_jobs_view(monkeypatch):
    nvml = fake_nvml(job_pid=os.getpid())
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    found, note = devices.discover()
    assert note is None
    assert [(d.name, d.index, d.uuid, d.memory_total >> 30) for d in found if d.kind == "cuda"] == [
        ("gpu0", 0, "GPU-0000", 80),
        ("gpu1-mig0", 1, "MIG-aaaa", 10),
        ("gpu1-mig2", 2, "MIG-bbbb", 20),
    ]
    assert found[0].links == (0, 10) and found[-1].kind == "cpu"
    # Every GPU goes by its UUID, so the user's CUDA_DEVICE_ORDER cannot renumber them.
    env = devices.environment([found[0], found[2]])
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0000,MIG-bbbb" and env["GQ_DEVICE"] == "cuda:0"

    sampler = sampling.Sampler(found)
    samples = sampler.sample({"gpu0": [(7, os.getpid())]})
    gpu0 = samples["gpu0"]
    assert (
        gpu0.source,
        gpu0.utilization,
        gpu0.temperature,
        gpu0.power,
        gpu0.power_limit,
        gpu0.sm_clock,
        gpu0.ecc_errors,
    ) == ("nvml", 87.0, 71, 312.5, 700.0, 1980, 0)
    assert gpu0.throttle == ["sw_power_cap", "hw_thermal"]
    assert gpu0.external_memory == 1 << 30  # the foreign process, not the gq job
    assert sorted((p.pid, p.job) for p in gpu0.processes) == [(os.getpid(), 7), (999999, None)]
    mig = samples["gpu1-mig0"]
    assert mig.utilization is None and mig.memory_total == 10 << 30 and mig.temperature == 71
    assert samples["cpu"].source == "psutil"
    sampler.close()
    # Where jobs have cgroups, a process is its job's by the cgroup it is in, however it
    # left the job's process tree (here the foreign-looking pid is job 8's).
    by_cgroup = sampling.Sampler(found, job_of={999999: 8, os.getpid(): 7}.get)
    gpu0 = by_cgroup.sample({"gpu0": [(7, os.getpid()), (8, 424242)]})["gpu0"]
    assert sorted((p.pid, p.job) for p in gpu0.processes) == [(os.getpid(), 7), (999999, 8)]
    assert gpu0.external_memory == 0
    # A process of a job placed on another device is no job's here: its memory is this one's.
    gpu0 = by_cgroup.sample({"gpu0": [(7, os.getpid())]})["gpu0"]
    assert sorted((p.pid, p.job) for p in gpu0.processes) == [(os.getpid(), 7), (999999, None)]
    assert gpu0.external_memory == 1 << 30
    by_cgroup.close()


def test_the_cpu_sampler_forgets_the_processes_of_ended_jobs():
    """A month of jobs must not leave a month of pids in the daemon: the sampler keeps the
    CPU time of the processes it saw in its last sample only."""
    sampler = sampling.Sampler([d for d in devices.discover()[0] if d.kind == "cpu"])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for _ in range(2):
            reading = sampler.sample({"cpu": [(1, child.pid)]})["cpu"]
        assert [p.pid for p in reading.processes] == [child.pid]
        assert child.pid in sampler.host.cpu_seconds
    finally:
        child.kill()
        child.wait()
    for _ in range(2):  # the job has ended: nothing of it is sampled, nothing kept
        sampler.sample({})
    assert sampler.host.cpu_seconds == {}
    sampler.close()


# ----- end to end ---------------------------------------------------------------------
def device_reading(name: str) -> dict:
    info = json.loads(gq_ok("info", "--json"))
    return next(d for d in info["devices"] if d["name"] == name)


def test_a_job_is_placed_on_the_idle_device_and_info_reports_the_samples(home, tmp_path):
    gq_ok("daemon", "start", "--cpu-devices", "2", "--kill-wait", "1")
    # (Python jobs: a shell job would have its device alone)
    busy = submit(
        "--gpu-mem", "100M", str(write_script(tmp_path / "busy.py", "while True:\n    pass\n"))
    )
    idle = submit(
        "--gpu-mem",
        "100M",
        str(write_script(tmp_path / "idle.py", "import time\ntime.sleep(300)\n")),
    )
    busy_device = wait_state(busy, "RUNNING")["device"]
    idle_device = wait_state(idle, "RUNNING")["device"]
    assert {busy_device, idle_device} == {"cpu0", "cpu1"}

    def measured():
        hot, cold = device_reading(busy_device), device_reading(idle_device)
        readings = hot["reading"], cold["reading"]
        return (
            all(r and r["utilization"] is not None for r in readings)
            # (a spinning shell may get a third of a core on a machine busy elsewhere)
            and hot["reading"]["utilization"] > cold["reading"]["utilization"] + 15
            and cold["reading"]["utilization"] < 20
            and (hot, cold)
        )

    hot, cold = wait_for(measured, 30, what="both devices sampled")
    assert hot["reading"]["source"] == "psutil"
    assert {p["job"] for p in hot["reading"]["processes"]} == {busy}
    assert (
        hot["reading"]["memory_used"] > 0 and hot["reading"]["memory_total"] == hot["memory_total"]
    )
    text = gq_ok("info")
    assert f"{busy_device}: " in text and "% busy" in text
    third = submit("--gpu-mem", "100M", str(tmp_path / "idle.py"))
    assert wait_state(third, "RUNNING")["device"] == idle_device  # 1 resident each: by load


def test_the_guard_holds_a_hot_device_then_admits_below_the_hysteresis(home, tmp_path):
    readings = tmp_path / "readings.jsonl"
    readings.write_text(json.dumps({"device": "cpu0", "temperature": 91}) + "\n")
    gq_ok(
        "daemon",
        "start",
        "--cpu-devices",
        "1",
        "--kill-wait",
        "1",
        "--max-temp",
        "80",
        "--readings",
        str(readings),
    )
    wait_for(lambda: device_reading("cpu0")["held"], 15, what="the guard to hold cpu0")
    waiting = submit(str(write_script(tmp_path / "s.sh", "sleep 300\n")))
    reason = wait_for(lambda: job(waiting)["reason"], 10, what="a reason")
    assert reason == "Resources (cpu0 too hot: 91 C (--max-temp 80); admits again at 75 C)"
    assert "guard: cpu0 too hot" in gq_ok("info")
    with readings.open("a") as out:  # under the limit, not yet under the margin
        out.write(json.dumps({"device": "cpu0", "temperature": 78}) + "\n")
    info = wait_for(
        lambda: "78 C" in (job(waiting)["reason"] or "") and job(waiting),
        15,
        what="the reason to follow the reading",
    )
    assert info["state"] == "PENDING"
    with readings.open("a") as out:
        out.write("not a reading\n" + json.dumps({"device": "cpu0", "temperature": 74}) + "\n")
    assert wait_state(waiting, "RUNNING", timeout=15)["device"] == "cpu0"
    assert device_reading("cpu0")["held"] is None
    log = (home / "daemon.log").read_text()
    assert "line 3 is not a reading" in log and "cpu0 admits jobs again" in log


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(samples: list, name: str, **labels) -> float | None:
    for sample in samples:
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    return None


def test_metrics_are_served_and_jobs_keep_their_figures(home, tmp_path):
    port = free_port()
    gq_ok("daemon", "start", "--kill-wait", "1", "--metrics", f"127.0.0.1:{port}")
    gq_ok("policy", "set", "fair")
    go = tmp_path / "go"
    ids = submit_resident(go, 2, *KERNEL_LOOP, "--steps", "60", "--iter-ms", "5")
    go.touch()
    for job_id in ids:
        wait_state(job_id, "COMPLETED", timeout=60)

    def scraped():
        """Once the metrics show both jobs completed and what the host counts of its lanes,
        which it reports with its progress (once a second, and the jobs take less)."""
        families = scrape(port)
        done = value(
            families.get("gq_jobs", []), "gq_jobs", state="COMPLETED", user=job(ids[0])["user"]
        )
        switched = value(
            families.get("gq_lane_switches", []), "gq_lane_switches_total", device="cpu"
        )
        return done == 2 and (switched or 0) > 2 and families  # they took turns

    families = wait_for(
        scraped, 15, what="the metrics to show both jobs completed and the lane passed between them"
    )
    assert value(families["gq_job_wait_seconds"], "gq_job_wait_seconds_count") == 2
    assert value(families["gq_job_run_seconds"], "gq_job_run_seconds_count", state="COMPLETED") == 2
    assert value(families["gq_lane_residents"], "gq_lane_residents", device="cpu", lane="0") == 0
    assert value(families["DCGM_FI_DEV_GPU_UTIL"], "DCGM_FI_DEV_GPU_UTIL", device="cpu") is not None
    assert value(families["DCGM_FI_DEV_FB_FREE"], "DCGM_FI_DEV_FB_FREE", device="cpu") > 0
    # The figures each job measured stay with it.
    for job_id in ids:
        done = job(job_id)
        assert done["steps_done"] == 60 and done["iterations_per_second"] > 0
        assert 0 < done["lane_share"] <= 1 and done["attained"] > 0
        # Taking turns: charged all their lane time, no pace side by side to show.
        assert done["charged"] == done["attained"] and done["pace_side_by_side"] is None
    history = gq_ok("history")
    assert "IT/S" in history and "SHARE" in history and "PEAK MEM" in history
    shown = gq_ok("show", str(ids[0]))
    assert "LaneShare: " in shown and "SideBySide: never (its lane time was charged" in shown


def test_bad_daemon_options_are_refused_and_start_nothing(home, tmp_path):
    for args, words in (
        (["--metrics", "nowhere"], "invalid --metrics 'nowhere'"),
        (["--metrics", "127.0.0.1:0"], "invalid --metrics"),
        (["--max-temp", "-5"], "--max-temp, --max-power and --client-timeout must be"),
        (["--readings", str(tmp_path / "missing")], "no such file"),
        (["--probe-wait", "0"], "--probe-wait 0: give a time of more than 0"),
        (["--probe-wait", "2hours"], "at most 1 hour (60, 90s, 5min)"),
        (["--probe-wait", "soon"], "invalid --probe-wait soon"),
        (["--fair-half-life", "0"], "invalid period '0'"),
        (["--fair-half-life", "nan"], "invalid period 'nan'"),
        (["--fair-half-life", "-1day"], "invalid period '-1day'"),
        (["--fair-half-life", "9" * 60], "invalid period"),
        (["--lanes", "0"], "--lanes 0: give 'auto' or a count from 1 to 64"),
        (["--lanes", "nan"], "--lanes nan: give 'auto'"),
        (["--lanes", str(2**70)], "give 'auto' or a count"),
        (["--lanes", "auto\x00"], "give 'auto' or a count"),
    ):
        result = gq("daemon", "start", *args)
        assert result.code == 2 and words in result.err and result.err.count("\n") == 1
    assert not home.exists() or not (home / "daemon.pid").exists()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = gq("daemon", "start", "--metrics", f"127.0.0.1:{port}")
    assert result.code == 1 and "Address already in use" in result.err
    assert gq("daemon", "status").code == 1
    # Nor is anything left in the cgroup hierarchies (the daemon made its hosts' base).
    from gq.home import Home

    tag = Home(home).tag
    assert glob.glob(f"/sys/fs/cgroup/**/gq-{tag}", recursive=True) == []


def test_top_shows_the_node_and_quits_on_q(daemon, tmp_path):
    waiting = submit("--hold", str(write_script(tmp_path / "s.sh", "sleep 300\n")))
    batch = gq_ok("top", "-b", "-n", "1")
    assert (
        "DEVICE" in batch and "cpu" in batch and f"{waiting} " in batch and "JobHeldUser" in batch
    )
    assert gq("top", "-n", "0").code == 2
    main, other = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gq.cli.main", "top"],
        stdin=other,
        stdout=other,
        stderr=other,
        env=os.environ.copy(),
    )
    os.close(other)
    seen = b""

    def drawn():
        nonlocal seen
        if select.select([main], [], [], 0.1)[0]:
            try:
                seen += os.read(main, 65536)
            except OSError:  # EIO: gq top has exited; say what it printed
                raise AssertionError(seen.decode(errors="replace")[-3000:]) from None
        return b"JobHeldUser" in seen

    try:
        wait_for(drawn, 20, interval=0, what="gq top to draw the queue")
        assert b"\x1b[?1049h" in seen  # the alternate (full) screen
        os.write(main, b"q")
        assert process.wait(timeout=5) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(main)


# ----- optional parts missing -------------------------------------------------------------
def test_metrics_without_the_prometheus_client_are_refused_in_one_line(home, monkeypatch):
    """prometheus-client is the 'metrics' extra: without it --metrics is refused at once,
    saying what to install, and no daemon starts."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    refused = gq("daemon", "start", "--kill-wait", "1", "--metrics", f"127.0.0.1:{free_port()}")
    assert refused.code == 2
    assert refused.err.strip() == (
        "gq: error: --metrics needs gq's 'metrics' extra: pip install 'gq[metrics]'"
    )
    assert gq("daemon", "status").code == 1


def test_no_nvml_module_leaves_the_cpu_device_and_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py (the 'gpu' extra) missing
    found, note = devices.discover()
    assert [d.name for d in found] == ["cpu"]
    assert note == "no NVIDIA GPU found: nvidia-ml-py is not installed (pip install 'gq[gpu]')"


def test_the_daemon_and_the_cli_import_without_the_optional_parts():
    """Neither the daemon nor any command imports an extra at start-up."""
    code = (
        "import sys\n"
        "for extra in ('prometheus_client', 'pynvml', 'matplotlib', 'ipykernel'):\n"
        "    sys.modules[extra] = None\n"
        "import gq.daemon.node, gq.daemon.__main__, gq.cli.main\n"
        "import gq.exec.host.startup, gq.exec.job.worker\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

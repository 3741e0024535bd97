"""MPS (gq.daemon.mps): its pure rules, its control daemons brought up, adopted, restarted
and quit through a fake nvidia-cuda-mps-control (tests/fake_mps.py), and the one-user rule of
lanes side by side (gq.exec.lane.packing.may_share)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import fake_mps

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import pytest

from gq.daemon import mps
from gq.daemon.devices import Device, emulated
from gq.exec.lane.packing import Mode, Packer, Sample
from gq.home import Home

from gpu_check_lib import mps_controls  # noqa: E402

GPU = Device("gpu0", "cuda", 0, 80 << 30, "H100", uuid="GPU-abc", gpu=0)
MIG = Device("gpu1-mig0", "cuda", 1, 10 << 30, "A100 MIG 0", uuid="MIG-def", gpu=1)
CPU = Device("cpu", "cpu", None, 64 << 30, "x86_64")


def test_what_is_served_and_why_not():
    cpus = emulated(2, 8 << 30)
    assert mps.servable([GPU, MIG, CPU, *cpus]) == [GPU, MIG]
    assert mps.servable([CPU, *cpus], "cpu1, nothing") == [cpus[1]]
    assert mps.servable([CPU], "cpu") == []  # (the cpu device itself never)
    assert mps.off_reason(False, "/bin/x", [GPU]) == mps.NOT_ASKED
    assert mps.off_reason(True, None, [GPU]) == "no nvidia-cuda-mps-control on PATH"
    assert mps.off_reason(True, "/bin/x", []) == "no CUDA device"
    assert mps.off_reason(True, "/bin/x", [GPU]) is None


def test_the_lines_gq_info_shows():
    assert mps.summary(mps.NOT_ASKED, {}, {}) == "MPS: off (not asked: gq daemon start --mps)"
    assert mps.summary(None, {"gpu0": 0}, {}) == "MPS: on (devices 0)"
    assert mps.summary(None, {"gpu1": 1, "gpu0": 0}, {}) == "MPS: on (devices 0,1)"
    assert mps.summary(None, {"gpu0": 0}, {"gpu1": "it did not answer"}) == (
        "MPS: on (devices 0); off on gpu1 (it did not answer)"
    )
    assert mps.summary(None, {}, {"gpu0": "exited 1"}) == "MPS: off on gpu0 (exited 1)"


def test_a_clients_limits_come_from_its_lanes():
    assert [mps.thread_percentage(n) for n in (1, 2, 3, 4, 64, 0)] == [100, 50, 33, 25, 2, 100]
    assert mps.pinned_limit(80 << 30) == "0=81920M"
    assert mps.pinned_limit((40 << 30) + 12345) == "0=40960M"  # whole MiB, down
    assert mps.pinned_limit(1000) == "0=1M"
    assert mps.client_environment("/p", 4 << 30, 2) == {
        mps.PIPE: "/p",
        mps.MEMORY: "0=4096M",
        mps.THREADS: "50",
    }


def test_a_device_serves_one_user_at_a_time():
    assert mps.serves("alice", [])
    assert mps.serves("alice", ["alice", "alice"])
    assert not mps.serves("alice", ["alice", "bob"])


def test_a_control_daemon_sees_its_device_alone_and_no_mps_settings_of_the_daemon():
    base = {"PATH": "/bin", "CUDA_MPS_PIPE_DIRECTORY": "/elsewhere", "CUDA_MPS_X": "1"}
    env = mps.control_environment(base, MIG, Path("/s/pipe"), Path("/s/log"))
    assert env == {
        "PATH": "/bin",
        mps.PIPE: "/s/pipe",
        mps.LOGS: "/s/log",
        "CUDA_VISIBLE_DEVICES": "MIG-def",
    }
    cpu1 = emulated(2, 8 << 30)[1]
    assert mps.control_environment({}, cpu1, Path("p"), Path("l"))["CUDA_VISIBLE_DEVICES"] == "1"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake control on PATH; its record; the node's two emulated devices served."""
    record = tmp_path / "mps-record.jsonl"
    fake_mps.install(tmp_path / "bin", record)
    environ = {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        mps.FAKE_DEVICES: "cpu0,cpu1",
    }
    yield record, environ
    for event in fake_mps.events(record, "up"):  # none left past a failed test
        if fake_mps.alive(event["pid"]):
            os.kill(event["pid"], signal.SIGKILL)


def node_mps(root: Path, environ: dict, asked: bool = True, lanes: int = 2) -> mps.Mps:
    root.mkdir(mode=0o700, exist_ok=True)
    return mps.Mps(
        Home(root), emulated(2, 8 << 30), asked, lanes, lambda d: d.memory_total // lanes, environ
    )


def test_control_daemons_come_up_answer_and_quit(tmp_path, fake):
    record, environ = fake
    node = node_mps(tmp_path / "home", environ)
    node.start()
    assert node.line == "MPS: on (devices 0,1)" and not node.failed
    starts = fake_mps.events(record, "start")
    pipes = [tmp_path / "home" / "mps" / name / "pipe" for name in ("cpu0", "cpu1")]
    assert [(s["pipe"], s["visible"], s["mps"]) for s in starts] == [
        (str(pipes[0]), "0", {}),
        (str(pipes[1]), "1", {}),
    ]
    assert starts[0]["log"] == str(tmp_path / "home" / "mps" / "cpu0" / "log")
    for directory in (pipes[0], pipes[0].parent, pipes[0].parent / "log"):
        assert directory.stat().st_mode & 0o777 == 0o755
    assert [e["commands"] for e in fake_mps.events(record, "command")][:2] == [
        ["set_default_active_thread_percentage 50"],
        ["set_default_device_pinned_mem_limit 0 2048M"],
    ]
    cpu0 = node.on["cpu0"]
    assert node.environment("alice", [cpu0], ["alice"]) == {
        mps.PIPE: str(pipes[0]),
        mps.MEMORY: "0=2048M",
        mps.THREADS: "50",
    }
    assert node.environment("alice", [cpu0], ["bob"]) == {}  # bob's server may run there
    assert node.environment("alice", [cpu0, node.on["cpu1"]], []) == {}  # one pipe a job
    assert sorted(mps_controls(tmp_path / "home")) == sorted(
        e["pid"] for e in fake_mps.events(record, "up")
    )  # (what the GPU check looks for after a stop)
    node.stop()
    assert not node.on and mps_controls(tmp_path / "home") == []
    down = fake_mps.events(record, "down")
    assert sorted(e["pipe"] for e in down) == sorted(map(str, pipes))
    assert not any(fake_mps.alive(e["pid"]) for e in fake_mps.events(record, "up"))


def test_a_live_control_daemon_is_adopted_a_dead_ones_files_cleared_a_stopped_one_restarted(
    tmp_path, fake
):
    record, environ = fake
    first = node_mps(tmp_path / "home", environ)
    first.start()
    up = {e["pipe"]: e["pid"] for e in fake_mps.events(record, "up")}
    # The daemon died; the next finds cpu0's control alive, cpu1's dead with its files left.
    cpu1_pipe = str(tmp_path / "home" / "mps" / "cpu1" / "pipe")
    os.kill(up[cpu1_pipe], signal.SIGKILL)
    fake_mps.wait_gone(up[cpu1_pipe])
    assert os.path.exists(os.path.join(cpu1_pipe, "control"))
    second = node_mps(tmp_path / "home", environ)
    second.start()
    assert second.line == "MPS: on (devices 0,1)"
    assert [e["pipe"] for e in fake_mps.events(record, "start")][2:] == [cpu1_pipe]
    # A control daemon that stops answering is started again at the next look.
    again = {e["pipe"]: e["pid"] for e in fake_mps.events(record, "up")}[cpu1_pipe]
    os.kill(again, signal.SIGKILL)
    fake_mps.wait_gone(again)
    second.tend()
    assert second.line == "MPS: on (devices 0,1)"
    assert [e["pipe"] for e in fake_mps.events(record, "start")][3:] == [cpu1_pipe]
    second.stop()
    assert not any(fake_mps.alive(e["pid"]) for e in fake_mps.events(record, "up"))


def test_one_left_by_a_daemon_with_mps_is_quit_by_one_without(tmp_path, fake):
    record, environ = fake
    node_mps(tmp_path / "home", environ).start()
    without = node_mps(tmp_path / "home", environ, asked=False)
    without.start()
    assert without.line == "MPS: off (not asked: gq daemon start --mps)"
    quits = [e for e in fake_mps.events(record, "command") if e["commands"] == ["quit"]]
    assert len(quits) == 2  # (asked, not waited for: its clients may still run)
    for event in fake_mps.events(record, "up"):
        fake_mps.wait_gone(event["pid"])


def test_a_control_daemon_that_fails_leaves_mps_off_on_its_device_saying_why(tmp_path):
    broken = tmp_path / "bin" / "nvidia-cuda-mps-control"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\necho 'no GPU here' >&2\nexit 3\n")
    broken.chmod(0o755)
    environ = {"PATH": str(broken.parent), mps.FAKE_DEVICES: "cpu0"}
    node = node_mps(tmp_path / "home", environ)
    node.start()
    assert node.line == "MPS: off on cpu0 (nvidia-cuda-mps-control -d exited 3: no GPU here)"
    assert node.environment("alice", [emulated(2, 8 << 30)[0]], []) == {}


# ----- lanes side by side under MPS: one user's jobs ----------------------------------------
def run_idle_jobs(packer: Packer, users: dict[int, str], seconds: float = 10.0) -> None:
    """Jobs that leave the device half idle (side by side, each nearly at full speed), ticked
    every half second."""
    work = dict.fromkeys(users, 0.0)
    iterations = dict.fromkeys(users, 0)
    now = 0.0
    while now < seconds:
        for job in users:
            work[job] += 0.5 * (0.5 if packer.mode is Mode.TURNS else 0.95)
            iterations[job] += 10
        now += 0.5
        packer.tick(now, [Sample(j, work[j], iterations[j], user=u) for j, u in users.items()])


def test_under_mps_only_one_users_jobs_run_side_by_side():
    from gq.exec.lane.packing import may_share

    assert may_share(["alice", "bob"], mps=False)
    assert may_share(["alice", "alice"], mps=True) and may_share([], mps=True)
    assert not may_share(["alice", "bob", "alice"], mps=True)
    mixed = Packer(lanes=2, mps=True)
    run_idle_jobs(mixed, {1: "alice", 2: "bob"})
    assert mixed.mode is Mode.TURNS and set(mixed.plan().values()) == {0}
    alone = Packer(lanes=2, mps=True)
    run_idle_jobs(alone, {1: "alice", 2: "alice"})
    assert alone.mode is Mode.PACKED and alone.plan() == {1: 0, 2: 1}
    without = Packer(lanes=2)
    run_idle_jobs(without, {1: "alice", 2: "bob"})
    assert without.mode is Mode.PACKED  # (driver time-slicing: as it pays)


def test_a_pipe_directory_that_is_not_the_daemons_own_is_not_used(tmp_path, fake):
    _record, environ = fake
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "home" / "mps" / "cpu0").mkdir(parents=True)
    (tmp_path / "home" / "mps" / "cpu0" / "pipe").symlink_to(elsewhere)
    node = node_mps(tmp_path / "home", environ)
    node.start()
    assert node.line.startswith("MPS: on (devices 1); off on cpu0 (")
    assert "is not a directory of the daemon's own" in node.line
    assert list(elsewhere.iterdir()) == []
    node.stop()

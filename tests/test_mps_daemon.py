"""gq daemon start --mps through the real daemon, hosts and CLI, on two emulated devices
served as if CUDA ones (GQ_FAKE_MPS_DEVICES) by a fake nvidia-cuda-mps-control on PATH
(tests/fake_mps.py): gq info, the control daemons' environment, what a job sees, restart,
stop, a crash, and MPS off with its reason."""

from __future__ import annotations

import json
import os
import signal

import fake_mps
import pytest

from gq.daemon import mps

from conftest import DECLARED, DaemonControl, gq, gq_ok, job, submit, wait_state, write_script

OWN = {  # what a submitter's environment says of MPS: never what its job gets under gq's
    "CUDA_MPS_PIPE_DIRECTORY": "/tmp/not-gq-s",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=999999M",
    "CUDA_MPS_LOG_DIRECTORY": "/tmp/not-gq-s-log",
}
NODE = ("--cpu-devices", "2", "--cpu-memory", "8G", "--lanes", "2")


@pytest.fixture
def record(home, tmp_path, monkeypatch):
    """The fake on the daemon's PATH, its record, and the devices it serves."""
    path = tmp_path / "mps-record.jsonl"
    fake_mps.install(tmp_path / "bin", path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(mps.FAKE_DEVICES, "cpu0,cpu1")
    for name, value in OWN.items():
        monkeypatch.setenv(name, value)
    yield path
    for event in fake_mps.events(path, "up"):  # none left past a failed test
        if fake_mps.alive(event["pid"]):
            os.kill(event["pid"], signal.SIGKILL)


def mps_line() -> str:
    return next(line for line in gq_ok("info").splitlines() if line.startswith("MPS: "))


def job_sees(tmp_path, name: str) -> tuple[dict[str, str], str]:
    """A job's MPS settings, as it found them in its environment, and its device."""
    out = tmp_path / f"{name}.env"
    script = write_script(
        tmp_path / f"{name}.sh", f"#!/bin/sh\nenv | grep '^CUDA_MPS_' > {out}\n", 0o755
    )
    job_id = submit(str(script))
    wait_state(job_id, "COMPLETED")
    settings = dict(line.split("=", 1) for line in out.read_text().splitlines())
    return settings, job(job_id)["device"]


def test_mps_on_through_the_daemon_restart_and_stop(home, record, tmp_path):
    daemon = DaemonControl(home)
    daemon.start(*NODE, "--mps")
    assert mps_line() == "MPS: on (devices 0,1)"
    starts = fake_mps.events(record, "start")
    assert [(s["pipe"], s["log"], s["visible"], s["mps"]) for s in starts] == [
        (str(home / "mps" / d / "pipe"), str(home / "mps" / d / "log"), str(i), {})
        for i, d in enumerate(("cpu0", "cpu1"))
    ]
    seen, device = job_sees(tmp_path, "first")
    assert seen == {  # its device's pipe; --lanes 2 of 4G: 2048M and half the threads each
        "CUDA_MPS_PIPE_DIRECTORY": str(home / "mps" / device / "pipe"),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }
    assert "--mps" in json.loads(gq_ok("info", "--json"))["options"]
    for name in ("cpu0", "cpu1"):  # each host keeps side by side to one user's jobs
        assert "jobs side by side are one user's" in (home / "hosts" / f"{name}.log").read_text()

    gq_ok("daemon", "restart")  # its jobs, and so the control daemons, are kept: adopted
    assert mps_line() == "MPS: on (devices 0,1)"
    assert len(fake_mps.events(record, "start")) == 2
    assert "adopted the control daemon of cpu0" in daemon.log()
    assert job_sees(tmp_path, "second")[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"

    gq_ok("daemon", "stop")
    down = fake_mps.events(record, "down")
    assert sorted(e["pipe"] for e in down) == [
        str(home / "mps" / d / "pipe") for d in ("cpu0", "cpu1")
    ]
    quits = [e for e in fake_mps.events(record, "command") if e["commands"] == ["quit"]]
    assert len(quits) == 2
    assert not any(fake_mps.alive(e["pid"]) for e in fake_mps.events(record, "up"))


def test_a_crashed_daemons_control_daemons_are_stopped_by_one_without_mps(home, record):
    daemon = DaemonControl(home)
    daemon.start(*NODE, "--mps")
    daemon.kill9()
    assert not fake_mps.events(record, "down")
    daemon.start(*NODE)
    assert mps_line() == "MPS: off (not asked: gq daemon start --mps)"
    quits = [e for e in fake_mps.events(record, "command") if e["commands"] == ["quit"]]
    assert len(quits) == 2
    for event in fake_mps.events(record, "up"):
        fake_mps.wait_gone(event["pid"])


def test_mps_off_says_why_and_leaves_a_jobs_own_settings(home, tmp_path, monkeypatch):
    for name, value in OWN.items():
        monkeypatch.setenv(name, value)
    daemon = DaemonControl(home)
    daemon.start(*NODE, "--mps")  # no nvidia-cuda-mps-control on this PATH
    assert mps_line() == "MPS: off (no nvidia-cuda-mps-control on PATH)"
    assert job_sees(tmp_path, "own")[0] == OWN  # (gq's MPS is off: they are the job's)
    gq_ok("daemon", "stop")
    fake_mps.install(tmp_path / "bin", tmp_path / "record.jsonl")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    daemon.start(*NODE, "--mps")  # a control, but no CUDA device named
    assert mps_line() == "MPS: off (no CUDA device)"
    gq_ok("daemon", "stop")
    daemon.start(*NODE)
    assert mps_line() == "MPS: off (not asked: gq daemon start --mps)"
    assert not (tmp_path / "record.jsonl").exists()  # (nothing asked of it)


def test_asking_a_running_daemon_without_mps_for_it_is_refused_in_one_line(home, record):
    daemon = DaemonControl(home)
    pid = daemon.start(*NODE)
    refused = gq("daemon", "start", "--mps")
    assert refused.code != 0 and len(refused.err.strip().splitlines()) == 1
    assert "without --mps" in refused.err and f"pid {pid}" in refused.err
    assert daemon.pid() == pid and mps_line().startswith("MPS: off (not asked")
    assert not fake_mps.events(record)


def test_on_a_shared_node_a_device_serves_one_users_jobs_at_a_time(shared_node, users, tmp_path):
    """alice's job is an MPS client of cpu0; bob's, started beside it, is not (his server
    could not start while hers runs); once hers has ended, bob's next one is."""
    alice, bob = users["alice"], users["bob"]
    record = tmp_path / "mps-record.jsonl"
    fake_mps.install(tmp_path / "mpsbin", record)
    shared_node.ok(None, "daemon", "stop")
    shared_node.env["PATH"] = f"{tmp_path / 'mpsbin'}{os.pathsep}{shared_node.env['PATH']}"
    shared_node.env[mps.FAKE_DEVICES] = "cpu0"
    shared_node.start("--cpu-devices", "1", "--mps")
    assert "MPS: on (devices 0)" in shared_node.ok(None, "info")
    go = tmp_path / "go"

    def run(user, name: str, wait: bool = False) -> tuple[int, object]:
        out = user.workdir / f"{name}.env"
        body = (  # (a Python job: lanes are shared; a plain process has its device alone)
            "import os, time\n"
            f"with open({str(out)!r}, 'w') as found:\n"
            "    found.writelines(f'{k}={v}\\n' for k, v in os.environ.items()"
            " if k.startswith('CUDA_MPS_'))\n"
        )
        if wait:
            body += f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
        script = write_script(user.workdir / f"{name}.py", body)
        os.chown(script, user.uid, user.gid)
        submitted = shared_node.ok(user, "submit", "--parsable", "-t", "5", *DECLARED, script)
        job_id = int(submitted.strip())
        return job_id, out

    def seen(out) -> dict[str, str]:
        return dict(line.split("=", 1) for line in out.read_text().splitlines())

    hers, her_env = run(alice, "hers", wait=True)
    shared_node.wait_state(hers, "RUNNING")
    his, his_env = run(bob, "his")
    shared_node.wait_state(his, "COMPLETED")
    assert seen(his_env) == {}
    pipe = str(shared_node.root / "mps" / "cpu0" / "pipe")
    assert seen(her_env)["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    go.touch()
    shared_node.wait_state(hers, "COMPLETED")
    later, later_env = run(bob, "later")
    shared_node.wait_state(later, "COMPLETED")
    assert seen(later_env)["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    shared_node.ok(None, "daemon", "stop")
    assert not any(fake_mps.alive(e["pid"]) for e in fake_mps.events(record, "up"))

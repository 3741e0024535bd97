"""gq kernel: a Jupyter kernelspec whose kernel runs as a gq job, started by jupyter_client's
real KernelManager against a real daemon and driven through a blocking client, as a
notebook drives it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gq.exec.job import pending_notes

from conftest import ROOT, all_jobs, gq, gq_ok, job, submit, wait_for, wait_state

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A Jupyter data directory of the test's own; gq importable by the kernel's python; a
    runtime directory (XDG_RUNTIME_DIR) of the test's own, where pending notes are kept."""
    path = tmp_path / "jupyter"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(path))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    (tmp_path / "xdg-runtime").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg-runtime"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return path


def _kernel(name: str):
    """The kernel started as Jupyter starts it, its blocking client ready; its job id."""
    # Jupyter's SIGTERM comes after shutdown_wait_time (5 s by default): a busy machine may
    # take longer than that to end a kernel's job, which then ends CANCELLED.
    manager = jupyter_client.KernelManager(
        transport="ipc", kernel_name=name, shutdown_wait_time=30.0
    )
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=30)
    return manager, client


def _run(
    client, code: str, timeout: float = 15, stop_on_error: bool = True
) -> tuple[dict, list[dict]]:
    """Execute a cell: its reply's content and what it published (stream, result, error).
    A cell expected to fail passes stop_on_error=False: otherwise ipykernel aborts the cells
    that reach it before it has finished with the error, as a notebook's queued cells."""
    published = []
    reply = client.execute_interactive(
        code, timeout=timeout, output_hook=published.append, stop_on_error=stop_on_error
    )
    return reply["content"], published


def _result(published: list[dict]) -> str:
    return "".join(
        m["content"]["data"]["text/plain"] for m in published if m["msg_type"] == "execute_result"
    )


def _job_of(client) -> int:
    content, published = _run(client, "import os; int(os.environ['GQ_JOB_ID'])")
    assert content["status"] == "ok", content
    return int(_result(published))


def test_install_refuses_what_it_cannot_use_and_changes_nothing(data_dir):
    assert gq_ok("kernel", "install", "--name", "gpu", "-G", "0", "-t", "10:00").startswith(
        "Installed kernel gpu in "
    )
    spec = json.loads((data_dir / "kernels" / "gpu" / "kernel.json").read_text())
    assert spec["argv"][-6:] == ["kernel", "run", "--spec", "gpu", "--", "{connection_file}"]
    assert spec["interrupt_mode"] == "signal"
    assert spec["metadata"]["gq"]["submit"] == ["-G", "0", "-t", "10:00"]
    for args, said in [
        (["--name", "gpu"], "a kernel named 'gpu' exists already; give --replace"),
        (["--name", "../evil"], "a kernel's name is 1-64 lower-case letters"),
        (["--name", "x" * 65], "a kernel's name is 1-64"),
        (["--name", ""], "a kernel's name is 1-64"),
        (["--name", "k", "--bogus"], "submit options: No such option: --bogus"),
        (["--name", "k", "--array", "0-3"], "--array: a kernel runs once"),
        (["--name", "k", "--pty"], "--pty: a kernel runs once"),
        (["--name", "k", "-t", "forever"], "invalid time limit 'forever'"),
        (["--name", "k", "train.py"], "unexpected 'train.py'"),
    ]:
        done = gq("kernel", "install", *args)
        assert done.code == 2 and done.err.count("\n") == 1 and said in done.err, (args, done)
    assert sorted(os.listdir(data_dir / "kernels")) == ["gpu"]
    assert gq_ok("kernel", "install", "--name", "gpu", "--replace", "-G", "0").startswith(
        "Installed"
    )
    assert gq_ok("kernel", "list").split("\t")[:2] == ["gpu", "-G 0"]
    os.makedirs(data_dir / "kernels" / "other")
    (data_dir / "kernels" / "other" / "kernel.json").write_text(
        json.dumps(
            {
                "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "other",
                "language": "python",
            }
        )
    )
    assert "other" not in gq_ok("kernel", "list")
    refused = gq("kernel", "remove", "other")
    assert refused.code == 2 and "kernel 'other' is not gq's" in refused.err
    assert gq_ok("kernel", "remove", "gpu").startswith("Removed kernel gpu")
    assert sorted(os.listdir(data_dir / "kernels")) == ["other"]
    missing = gq("kernel", "remove", "gpu")
    assert missing.code == 2 and "no kernel named 'gpu'" in missing.err
    missing = gq("kernel", "run", "--spec", "gpu", "--", "kernel-1.json")
    assert missing.code == 2 and "no kernel named 'gpu'" in missing.err


def test_without_jupyter_installed_a_kernel_command_names_the_extra(data_dir, monkeypatch):
    for module in ("jupyter_client", "jupyter_client.kernelspec"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails, as if not installed
    for args in (["list"], ["install", "--name", "k"], ["remove", "k"]):
        done = gq("kernel", *args)
        assert done.code == 2 and done.err == (
            "gq: error: gq kernel needs Jupyter's client: pip install 'gq[jupyter]'\n"
        ), done
    assert not data_dir.exists()


def test_cells_run_in_a_gq_job_with_errors_and_interrupts_and_shutdown_ends_it(daemon, data_dir):
    gq_ok("kernel", "install", "--name", "gqk", "-G", "0")
    manager, client = _kernel("gqk")
    try:
        job_id = _job_of(client)
        info = job(job_id)
        assert (info["state"], info["interactive"]) == ("RUNNING", True), info
        content, published = _run(client, "1 + 1")
        assert content["status"] == "ok" and _result(published) == "2"
        content, _ = _run(client, "1 / 0", stop_on_error=False)
        assert (content["status"], content["ename"]) == ("error", "ZeroDivisionError")
        assert manager.is_alive()
        sleeping = client.execute("import time; time.sleep(30)", stop_on_error=False)

        def sleeping_cell_started() -> bool:  # its own input, not another request's status
            message = client.iopub_channel.get_msg(timeout=10)
            return (
                message["msg_type"] == "execute_input"
                and message["parent_header"].get("msg_id") == sleeping
            )

        wait_for(sleeping_cell_started, 10, what="the sleeping cell to start")
        began = time.monotonic()
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=10)
        while (
            reply["parent_header"].get("msg_type") != "execute_request"
            or reply["content"]["status"] == "ok"
        ):
            reply = client.get_shell_msg(timeout=10)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - began < 5
        content, published = _run(client, "'still here'")
        assert content["status"] == "ok" and _result(published) == "'still here'", content
        assert job(job_id)["state"] == "RUNNING"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    assert wait_state(job_id, "COMPLETED")["exit_code"] == 0  # the kernel's own clean end


def test_a_killed_launcher_cancels_its_kernel_and_a_cancelled_kernel_ends_it(daemon, data_dir):
    gq_ok("kernel", "install", "--name", "gqk", "-G", "0")
    manager, client = _kernel("gqk")
    job_id = _job_of(client)
    client.stop_channels()
    manager.provisioner.process.send_signal(signal.SIGTERM)  # as a shutdown unanswered
    wait_for(lambda: manager.provisioner.process.poll() is not None, 10, what="the launcher to end")
    assert manager.provisioner.process.returncode == 128 + signal.SIGTERM
    assert wait_state(job_id, "CANCELLED")["state"] == "CANCELLED"

    manager, client = _kernel("gqk")
    job_id = _job_of(client)
    client.stop_channels()
    gq_ok("cancel", str(job_id))
    wait_for(
        lambda: manager.provisioner.process.poll() is not None,
        15,
        what="the launcher to end with its job",
    )
    assert manager.provisioner.process.returncode != 0
    wait_state(job_id, "CANCELLED")
    manager.cleanup_resources()


def test_a_pending_kernel_says_why_and_its_shutdown_cancels_it(daemon, data_dir, tmp_path):
    held = submit("--hold", "--wrap", "true")
    gq_ok("kernel", "install", "--name", "later", "-G", "0", "--after", str(held))
    manager = jupyter_client.KernelManager(
        transport="ipc", kernel_name="later", shutdown_wait_time=1.0
    )
    with open(tmp_path / "launcher.err", "w") as said:  # what the Jupyter server logs
        manager.start_kernel(stderr=said)
    (kernel_id,) = wait_for(
        lambda: [j["id"] for j in all_jobs() if j["id"] != held], 10, what="the kernel's job"
    )
    wait_for(
        lambda: f"job {kernel_id} pending (Dependency)" in (tmp_path / "launcher.err").read_text(),
        10,
        what="the launcher to say why",
    )
    assert job(kernel_id)["interactive"] and manager.is_alive()
    manager.shutdown_kernel(now=False)  # no kernel answers: Jupyter's SIGTERM follows
    assert wait_state(kernel_id, "CANCELLED")["start_time"] is None
    wait_for(
        lambda: not _leftovers(tmp_path, manager.connection_file),
        10,
        what="the launcher to remove its note",
    )
    refused = gq("kernel", "run", "--spec", "nothing", "--", "conn.json")
    assert refused.code == 2 and "no kernel named 'nothing'" in refused.err


def _waited_kernel(tmp_path: Path, connection_file: Path | None = None):
    """A kernel whose job waited on a held one until its launcher said why (in the Jupyter
    server's log: ``launcher.err``), then released; its manager and client, ready."""
    held = submit("--hold", "--wrap", "true")
    gq_ok("kernel", "install", "--name", "later", "-G", "0", "--after", str(held))
    manager = jupyter_client.KernelManager(transport="ipc", kernel_name="later")
    if connection_file is not None:
        manager.connection_file = str(connection_file)
    with open(tmp_path / "launcher.err", "w") as said:
        manager.start_kernel(stderr=said)
    client = manager.client()
    client.start_channels()
    try:
        wait_for(
            lambda: (
                " pending (Dependency); a shutdown of the kernel cancels it"
                in (tmp_path / "launcher.err").read_text()
            ),
            10,
            what="the launcher to say why",
        )
        gq_ok("release", str(held))
        client.wait_for_ready(timeout=30)
    except BaseException:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        raise
    return manager, client


def _first_cell(client) -> tuple[int, str]:
    """The job id the kernel's first cell finds, and what else that cell printed."""
    content, published = _run(client, "import os; int(os.environ['GQ_JOB_ID'])")
    assert content["status"] == "ok", content
    streams = "".join(m["content"]["text"] for m in published if m["msg_type"] == "stream")
    return int(_result(published)), streams


def _why(kernel_id: int) -> str:
    """What the first cell of a kernel that waited on a held job says."""
    return f"gq: this kernel waited for its device: job {kernel_id} pending (Dependency)\n"


def _leftovers(tmp_path: Path, connection_file: str) -> list[Path]:
    """Notes left where the launcher keeps them now (XDG_RUNTIME_DIR) or kept them once
    (beside the connection file, which jupyter_client puts in /tmp)."""
    return [
        *(p for p in (tmp_path / "xdg-runtime").rglob("*") if not p.is_dir()),
        *Path(connection_file).parent.glob(f"{Path(connection_file).name}.gq-pending*"),
    ]


def _world_tmp(tmp_path: Path) -> Path:
    """A directory as /tmp is, where nbclient and papermill put connection files: root's,
    sticky, every user may add to it (and reach it)."""
    for parent in (tmp_path, *tmp_path.parents):
        if not parent.stat().st_mode & 0o001:
            parent.chmod(parent.stat().st_mode | 0o001)
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def _as(user, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", user.name, "--", *argv], capture_output=True, text=True, timeout=30
    )


def test_a_kernel_that_waited_says_why_in_its_first_cell(daemon, data_dir, tmp_path):
    """A notebook shows no launcher's log: the first cell of a kernel that was pending says
    why it waited, once; the note is gone after."""
    manager, client = _waited_kernel(tmp_path)
    try:
        kernel_id, said = _first_cell(client)
        assert said == _why(kernel_id)
        content, published = _run(client, "'second'")
        assert not [m for m in published if m["msg_type"] == "stream"], published
        assert not _leftovers(tmp_path, manager.connection_file)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)


def test_a_link_planted_beside_the_connection_file_is_not_followed(
    daemon, data_dir, tmp_path, users
):
    """Another user's link where the launcher once wrote its note (``<conn>.gq-pending.new``,
    beside a connection file in /tmp) does not make it write a file of its owner's."""
    secret = tmp_path / "secret"
    secret.write_text("the owner's own\n")
    secret.chmod(0o600)
    connection = _world_tmp(tmp_path) / "kernel-linked.json"
    planted = _as(users["bob"], "ln", "-s", str(secret), f"{connection}.gq-pending.new")
    assert planted.returncode == 0, planted.stderr
    manager, client = _waited_kernel(tmp_path, connection)
    try:
        kernel_id, said = _first_cell(client)
        assert said == _why(kernel_id)
        assert secret.read_text() == "the owner's own\n"
        assert os.readlink(f"{connection}.gq-pending.new") == str(secret)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)


def test_a_fifo_planted_beside_the_connection_file_blocks_no_kernel(
    daemon, data_dir, tmp_path, users
):
    """Another user's FIFO where the kernel once read its note (``<conn>.gq-pending``), and
    a directory where the launcher would have replaced it from: the kernel answers, and its
    first cell says why it waited."""
    connection = _world_tmp(tmp_path) / "kernel-fifo.json"
    for argv in (["mkfifo", f"{connection}.gq-pending"], ["mkdir", f"{connection}.gq-pending.new"]):
        planted = _as(users["bob"], *argv)
        assert planted.returncode == 0, planted.stderr
    manager, client = _waited_kernel(tmp_path, connection)  # kernel_info answered
    try:
        kernel_id, said = _first_cell(client)
        assert said == _why(kernel_id)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)


def test_nothing_at_the_notes_own_names_blocks_the_kernel(daemon, data_dir, tmp_path):
    """Were a FIFO at the note's name, and a directory at the name the launcher writes it
    under first (so that it cannot replace the FIFO), the kernel opens neither for ever: it
    answers, and its first cell says nothing of why it waited."""
    connection = tmp_path / "kernel-own.json"
    note = pending_notes.place(str(connection))
    assert note is not None and note.startswith(str(tmp_path / "xdg-runtime") + "/"), note
    os.mkfifo(note)
    os.mkdir(f"{note}.new")
    manager, client = _waited_kernel(tmp_path, connection)  # kernel_info answered
    try:
        assert _first_cell(client)[1] == ""
        assert stat.S_ISFIFO(os.lstat(note).st_mode)  # refused, not read
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)


@pytest.mark.long
def test_a_cell_holds_the_lane_while_it_computes_and_a_batch_job_runs_between(
    daemon, data_dir, tmp_path
):
    gq_ok("policy", "set", "fair")  # (fifo gives a later job no turn while the first runs)
    batch = tmp_path / "batch.py"
    batch.write_text("import gq, time\nfor _ in gq.steps(range(100000)):\n    time.sleep(0.2)\n")
    batch_id = submit("--gpu-mem", "64M", str(batch))
    wait_for(lambda: job(batch_id)["steps_done"] > 0, 15, what="the batch job's first steps")
    gq_ok("kernel", "install", "--name", "shared", "--gpu-mem", "1G")
    manager, client = _kernel("shared")
    try:
        kernel_id = _job_of(client)
        content, _ = _run(
            client,
            "import time, torch\nm = torch.nn.Linear(8, 8)\nx = torch.ones(8)\nm(x).sum().item()",
            timeout=60,
        )
        assert content["status"] == "ok", content
        # Between cells: the forward's iteration ended with its cell, the batch job goes on.
        steps = job(batch_id)["steps_done"]
        wait_for(
            lambda: job(batch_id)["steps_done"] > steps + 2,
            30,
            what="the batch job to go on while the kernel is idle",
        )
        # Its release reaches the queue within a host report and a flush (a second each).
        wait_for(lambda: not job(kernel_id)["holds_lane"], 10, what="the kernel's release")
        assert job(kernel_id)["state"] == "RUNNING"
        # A cell that computes holds the lane; its interrupt gives it back.
        client.execute("t = time.time()\nwhile time.time() - t < 30:\n    m(x)")
        wait_for(lambda: job(kernel_id)["holds_lane"], 15, what="the cell to hold the lane")
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=15)
        while (
            reply["parent_header"].get("msg_type") != "execute_request"
            or reply["content"]["status"] == "ok"
        ):
            reply = client.get_shell_msg(timeout=15)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        steps = job(batch_id)["steps_done"]
        wait_for(
            lambda: job(batch_id)["steps_done"] > steps + 2,
            30,
            what="the batch job to go on after the interrupted cell",
        )
        wait_for(lambda: not job(kernel_id)["holds_lane"], 10, what="the kernel's release")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    wait_state(kernel_id, "COMPLETED")
    gq_ok("cancel", str(batch_id))


@pytest.mark.long
def test_an_idle_kernel_is_ended_at_its_idle_timeout_and_says_so(daemon, data_dir, tmp_path):
    """As Jupyter's culler ends an idle kernel: a cell that computes past the timeout is not
    idle; a kernel that then sits idle that long is ended, and its launcher says why."""
    assert gq_ok(
        "kernel", "install", "--name", "culled", "-G", "0", "--idle-timeout", "0:08"
    ).startswith("Installed")  # (a kernel's start-up counts: ipykernel's import can take 5 s)
    assert "--idle-timeout 0:08" in gq_ok("kernel", "list")
    manager = jupyter_client.KernelManager(transport="ipc", kernel_name="culled")
    with open(tmp_path / "launcher.err", "w") as said:  # what the Jupyter server logs
        manager.start_kernel(stderr=said)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=30)
        job_id = _job_of(client)
        content, published = _run(client, "import time; time.sleep(10); 'computed'", timeout=30)
        assert content["status"] == "ok" and _result(published) == "'computed'"
        assert job(job_id)["state"] == "RUNNING"
        ended = wait_state(job_id, "TIMEOUT", timeout=20)
        assert ended["reason"].startswith("idle timeout: no activity for 0:0"), ended
        wait_for(lambda: not manager.is_alive(), 10, what="the kernel's launcher to end")
        assert f"gq: job {job_id} TIMEOUT: idle timeout" in (tmp_path / "launcher.err").read_text()
    finally:
        client.stop_channels()
        manager.cleanup_resources()


def test_a_restart_ends_the_job_and_starts_a_new_one_on_the_same_ports(daemon, data_dir):
    gq_ok("kernel", "install", "--name", "gqk", "-G", "0")
    manager, client = _kernel("gqk")
    try:
        first = _job_of(client)
        _run(client, "kept = 1")
        manager.restart_kernel(now=False)
        assert wait_state(first, "COMPLETED")["exit_code"] == 0
        client.wait_for_ready(timeout=30)
        second = _job_of(client)
        assert second != first and job(second)["state"] == "RUNNING"
        content, _ = _run(client, "kept")
        assert (content["status"], content["ename"]) == ("error", "NameError")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    wait_state(second, "COMPLETED")


def test_a_signal_request_takes_a_few_signals_to_running_jobs_and_a_kernel_its_file(
    daemon, data_dir
):
    from gq import client, messages
    from gq.errors import UserError

    held = submit("--hold", "--wrap", "true")
    for name, said in [
        ("KILL", "cannot send SIGKILL to a job; give one of INT, HUP"),
        ("9", "cannot send SIG9"),
        ("", "cannot send SIG to a job"),
        ("INT", f"job {held} is PENDING; only a running job can be signalled"),
    ]:
        with pytest.raises(UserError, match=said):
            client.ask(messages.SignalJob(str(held), name))
    with pytest.raises(UserError, match="999"):
        client.ask(messages.SignalJob("999", "INT"))
    with pytest.raises(UserError, match="signal.signal: expected `str` of length <= 8"):
        client.ask(messages.SignalJob(str(held), "INT" * 10))
    assert job(held)["state"] == "PENDING"
    gq_ok("kernel", "install", "--name", "gqk", "-G", "0")
    missing = gq("kernel", "run", "--spec", "gqk", "--", str(data_dir / "kernel-1.json"))
    assert missing.code == 2 and "no such connection file" in missing.err
    assert [j["id"] for j in all_jobs()] == [held]

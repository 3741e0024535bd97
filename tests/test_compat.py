"""Whatever runs bare runs under gq: unmodified-style scripts from tests/zoo, each submitted
as is, ending as it ends under plain `python`, with the iterations gq found in it."""

from __future__ import annotations

import pytest

from conftest import ROOT, gq_ok, job, submit, wait_for, wait_state

ZOO = ROOT / "tests" / "zoo"

# script and arguments -> (end state, exit code, steps gq should count, a line of its output)
EXPECTED = {
    ("lbfgs_closure.py",): ("COMPLETED", 0, 12, "lbfgs done"),
    # 50 optimizer steps; its 20 evaluation forwards are not training steps
    ("amp_accumulation.py",): ("COMPLETED", 0, 50, "amp done"),
    ("dataloader_workers.py", "fork"): ("COMPLETED", 0, 16, "dataloader fork done"),
    ("dataloader_workers.py", "spawn"): ("COMPLETED", 0, 16, "dataloader spawn done"),
    # 4 threads x 300 module calls under no_grad: no deadlock, every call an iteration
    ("threaded_inference.py",): ("COMPLETED", 0, 1200, "threads done"),
    ("no_optimizer.py",): ("COMPLETED", 0, 0, "no optimizer done"),
    # (weights updated by hand: tests/test_loop_shapes.py runs two such jobs)
    # two optimizers a step: 25 iterations, not 50
    ("gan_two_optimizers.py",): ("COMPLETED", 0, 25, "gan done"),
    # a loss module called at top level is no second batch
    ("evaluation_with_loss.py",): ("COMPLETED", 0, 30, "evaluation done"),
    ("compiled.py",): ("COMPLETED", 0, 20, "compiled done"),
    ("exits_three.py",): ("FAILED", 3, 0, "exiting 3"),
}


def _run(tmp_path, *script_and_args: str) -> int:
    name, *args = script_and_args
    return submit("-o", str(tmp_path / "%x-%j.out"), str(ZOO / name), *args)


def _output(tmp_path, job_id: int) -> str:
    return next(tmp_path.glob(f"*-{job_id}.out")).read_text()


@pytest.mark.long
def test_zoo_scripts_run_under_gq_as_they_do_bare(home, tmp_path):
    gq_ok("daemon", "start", "--kill-wait", "1", "--max-resident", "8")
    gq_ok("policy", "set", "fair")
    ids = {key: _run(tmp_path, *key) for key in EXPECTED}
    for key, job_id in ids.items():
        state, code, steps, line = EXPECTED[key]
        info = wait_state(job_id, "COMPLETED", "FAILED", timeout=180)
        output = _output(tmp_path, job_id)
        assert (info["state"], info["exit_code"]) == (state, code), (key, output)
        assert info["steps_done"] == steps, (key, info["steps_done"], output)
        assert line in output, (key, output)
        assert "global hooks" not in output, (key, output)  # gq's hooks are not the script's


def test_the_script_sees_its_own_path_and_reads_data_beside_it(daemon, tmp_path):
    job_id = _run(tmp_path, "reads_beside_itself.py")
    assert wait_state(job_id, "COMPLETED")["exit_code"] == 0
    script = ZOO / "reads_beside_itself.py"
    assert _output(tmp_path, job_id).strip() == (f"rows=3 file={script} argv0={script} path0={ZOO}")


def test_a_traceback_names_the_users_file_with_no_gq_frames(daemon, tmp_path):
    job_id = _run(tmp_path, "raises.py")
    info = wait_state(job_id, "FAILED")
    assert info["exit_code"] == 1
    lines = _output(tmp_path, job_id).strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1] == f'  File "{ZOO / "raises.py"}", line 5, in <module>'
    assert lines[-1] == "ValueError: the user's own error"
    assert not any("gq" in line and "exec" in line or "runpy" in line for line in lines)


def test_an_exception_inside_a_module_call_releases_the_lane(daemon, tmp_path):
    gq_ok("policy", "set", "fair")
    idle, done = tmp_path / "idle", tmp_path / "done"
    raising = _run(tmp_path, "raising_module_then_idle.py", str(idle), str(done))
    wait_for(idle.exists, 60, what="the job to raise and go idle")
    other = _run(tmp_path, "no_optimizer.py")  # needs the lane the raising job left
    assert wait_state(other, "COMPLETED", timeout=60)["exit_code"] == 0
    assert job(raising)["state"] == "RUNNING"
    done.touch()
    assert wait_state(raising, "COMPLETED")["exit_code"] == 0

"""What gq status marks on a running job: its lane state only where it takes turns on a
lane, and MEM! only past its figure by more than the allocator's rounding."""

from __future__ import annotations

from gq import defaults

from conftest import DaemonControl, gq_ok, job, submit, wait_for, wait_state, write_script


def _row(job_id: int) -> list[str]:
    return next(
        line.split()
        for line in gq_ok("status", "--all").splitlines()[1:]
        if line.split()[0] == str(job_id)
    )


def test_a_job_that_takes_no_turns_on_a_lane_shows_none(daemon, tmp_path):
    """A shell script (with -G 0 or without) runs as a plain process, which never holds
    nor waits for a lane: LANE '-'; a Python job holds its lane or waits for it."""
    go = tmp_path / "go"
    plain = write_script(tmp_path / "plain.sh", f"while [ ! -e {go} ]; do sleep 0.05; done\n")
    python = write_script(
        tmp_path / "loop.py",
        (
            "import itertools, os, time, gq\n"
            "for _ in gq.steps(itertools.count()):\n"
            f"    if os.path.exists({str(go)!r}):\n"
            "        break\n"
            "    time.sleep(0.05)\n"
        ),
    )
    # The Python job first: under fifo a later one would wait for the lane behind them.
    worker, cpu_only, shared = (
        submit(str(python)),
        submit("-G", "0", str(plain)),
        submit(str(plain)),
    )
    for job_id in (cpu_only, shared, worker):
        wait_state(job_id, "RUNNING")
    wait_for(lambda: job(worker)["attained"] > 0, 30, what="the Python job's first iteration")
    headers = gq_ok("status", "--all").splitlines()[0].split()
    lane = headers.index("LANE")
    assert _row(cpu_only)[lane] == _row(shared)[lane] == "-"
    assert _row(worker)[lane] in ("holds", "waits")
    go.touch()
    for job_id in (cpu_only, shared, worker):
        wait_state(job_id, "COMPLETED")


def test_a_job_over_its_figure_by_the_allocators_rounding_is_not_flagged(home, tmp_path):
    """Declared 4 MiB under what the same script was measured to hold, it completes with
    no MEM! (its figure is its cap: more than the rounding over it would end it)."""
    DaemonControl(home).start("--cpu-devices", "1")
    script = write_script(
        tmp_path / "hold.py",
        (
            "import gq, time\n"
            "held = bytearray(64 << 20)\n"
            "held[::4096] = b'x' * len(held[::4096])\n"
            "for step in gq.steps(range(20)):\n"
            "    time.sleep(0.02)\n"
        ),
    )
    peak = wait_state(submit(str(script)), "COMPLETED")["mem_peak"]
    declared = peak - (4 << 20)
    honest = submit("--gpu-mem", f"{declared >> 10}K", str(script))
    info = wait_state(honest, "COMPLETED")
    assert info["run_count"] == 1 and info["mem"] == declared >> 10 << 10
    assert info["mem"] < info["mem_peak"] <= info["mem"] + defaults.MEM_OVER_SLACK
    assert not info["mem_over"]
    assert "MEM!" not in " ".join(_row(honest)) and "MEM!" not in gq_ok("show", str(honest))


def test_mem_flag_is_past_the_slack_alone():
    from gq.daemon.supervision.memory_figures import over_figure

    figure = 300 << 20
    assert not over_figure(figure, figure + defaults.MEM_OVER_SLACK)
    assert over_figure(figure, figure + defaults.MEM_OVER_SLACK + 1)
    assert not over_figure(None, figure) and not over_figure(figure, None)

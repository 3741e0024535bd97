"""examples/demo.sh, the README's first command, run as a user runs it: bash, python3 on the
PATH, the CLI and the daemon as real processes. It must show what it promises (srtf ends
the short job's wait; packing's makespan against one job at a time), stop its daemons and
leave nothing behind, in the repository or in the temporary directory, however it ends."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, wait_for

DEMO = ROOT / "examples" / "demo.sh"


def files_in_repo() -> set[Path]:
    """Every path in the checkout but git's and the bytecode Python caches (importing gq
    writes those wherever it may, demo or not)."""
    return {
        path
        for path in ROOT.rglob("*")
        if not {".git", "__pycache__", ".pytest_cache"} & set(path.relative_to(ROOT).parts)
    }


@contextlib.contextmanager
def demo(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """The demo in a session of its own (a terminal's process group), its temporary
    directory linked from ``tmp_path/tmp``, and this interpreter as the python3 it finds; ended
    as a terminal's Ctrl-C ends it where the test leaves it running."""
    # Its TMPDIR short, as a user's /tmp is: the demo's GQ_HOME is in it, and a unix
    # socket's path has room for 107 bytes (pytest's tmp_path can be longer than that).
    temp = Path(tempfile.mkdtemp(prefix="gq-t", dir="/tmp"))
    (tmp_path / "tmp").symlink_to(temp)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "GQ_HOME"}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT), TMPDIR=str(temp)
    )
    with subprocess.Popen(
        ["bash", str(DEMO)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as run:
        try:
            yield run
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGINT)
                run.communicate(timeout=120)
            _FINALLY.append(temp)


_FINALLY: list[Path] = []  # the demos' temporary directories, removed after each test


@pytest.fixture(autouse=True)
def _remove_temporaries():
    yield
    while _FINALLY:
        shutil.rmtree(_FINALLY.pop(), ignore_errors=True)


def _stuck(tmp_path: Path, late: subprocess.TimeoutExpired) -> str:
    """What a demo that did not end had printed, and the tails of its daemon's and hosts'
    logs (it removes them as it ends)."""
    said = late.output.decode(errors="replace") if isinstance(late.output, bytes) else late.output
    logs = sorted((tmp_path / "tmp").glob("gq-demo.*/home/**/*.log"))
    tails = [f"== {log.name}\n" + "\n".join(log.read_text().splitlines()[-25:]) for log in logs]
    return "\n".join([f"the demo had not ended after {late.timeout} s:", said or "", *tails])


def daemon_pids(output: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"gq daemon started \(pid (\d+)", output)]


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its new parent has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def row(output: str, label: str) -> list[float]:
    """The figures on the line of a table that starts with ``label``."""
    line = next(line for line in output.splitlines() if line.startswith(f"{label} "))
    return [float(figure) for figure in re.findall(r"\d+\.\d+", line)]


@pytest.mark.long
def test_the_demo_shows_srtf_and_packing_and_leaves_nothing(tmp_path):
    before = files_in_repo()
    with demo(tmp_path) as run:
        try:
            output, _ = run.communicate(timeout=300)
        except subprocess.TimeoutExpired as late:
            raise AssertionError(_stuck(tmp_path, late)) from None
    assert run.returncode == 0, output
    assert "JOBID  NAME" in output  # gq status, as the README promises
    (long_fifo, long_srtf), (medium_fifo, medium_srtf), (short_fifo, short_srtf) = (
        row(output, name) for name in ("long", "medium", "short")
    )
    # Each policy's order of ends, released together: fifo's is the queue's, srtf's the
    # shortest first. The averages are timings a loaded machine can even out; so is the
    # short job's 0.3 s after the medium one's end, which overlaps the medium one's exit.
    assert long_fifo < medium_fifo <= short_fifo, output
    assert short_srtf < medium_srtf < long_srtf, output
    # Under srtf the short job waits for nobody: it ends sooner than under fifo by more than
    # half the others' lane time (300 and 120 iterations of 10 ms). A difference, since the
    # jobs' start-up, seconds on a loaded machine, is in both (as a ratio it was not).
    assert short_fifo - short_srtf > 0.5 * (300 + 120) * 0.010, output
    (turns, turns_ratio), (packed, _) = row(output, "--lanes 1"), row(output, "--lanes auto")
    assert turns > 0 and packed > 0 and turns_ratio == 1.0, output
    pids = daemon_pids(output)
    assert len(pids) == 2 and all(gone(pid) for pid in pids), output
    assert not list((tmp_path / "tmp").iterdir())  # its GQ_HOME and the jobs' output
    assert files_in_repo() == before


def test_ctrl_c_stops_the_daemon_and_removes_the_demo_s_files(tmp_path):
    before = files_in_repo()
    with demo(tmp_path) as run:
        assert run.stdout is not None
        output = ""
        while not daemon_pids(output):  # the daemon is up: the first jobs come next
            line = run.stdout.readline()
            assert line, output
            output += line
        os.killpg(run.pid, signal.SIGINT)  # as ^C at a terminal: the whole foreground group
        output += run.communicate(timeout=120)[0]
    assert run.returncode != 0, output
    wait_for(lambda: gone(daemon_pids(output)[0]), 30, what="the daemon to stop")
    assert not list((tmp_path / "tmp").iterdir()), output
    assert files_in_repo() == before

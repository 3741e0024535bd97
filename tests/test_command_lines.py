"""gq show's Command is the command line the user gave, quoted as a shell would read it:
``gq run -- CMD ARGS``, ``gq submit --wrap "..."`` and ``gq submit SCRIPT ARGS`` alike."""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import sys

from gq.home import Home
from gq.queue import engine
from gq.queue.engine import HEAD_REVISION, Database, migrate

from conftest import gq, gq_ok, submit, wait_state, write_script


def _ran(*args: str) -> int:
    result = gq(*args[:1], "--parsable", *args[1:])
    assert result.code == 0, result.err
    return int(result.out)


def _command(job_id: int) -> str:
    line = next(
        line
        for line in gq_ok("show", str(job_id)).splitlines()
        if line.strip().startswith("Command:")
    )
    return line.split("Command: ", 1)[1]


def test_show_gives_the_command_line_the_user_gave(daemon, tmp_path, monkeypatch):
    """gq run -- torchrun --nproc-per-node 2 ddp.py showed `Command: .../(command)`, its
    arguments nowhere; a Python command showed the script alone, and a script's arguments
    came unquoted."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_script(bin_dir / "torchrun", '#!/bin/sh\necho "$@"\n', mode=0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    write_script(tmp_path / "train.py", "import sys\nprint('train', sys.argv[1:])\n")
    script = write_script(tmp_path / "job.sh", 'echo "$@"\n')
    python = os.path.basename(sys.executable)
    wrapped = "echo $SLURM_JOB_NAME; echo 'a  b'"
    expected = {
        _ran("run", "--", "torchrun", "--nproc-per-node", "2", "ddp.py"): (
            "torchrun --nproc-per-node 2 ddp.py"
        ),
        _ran("run", "--", python, "train.py", "--lr", "3e-4", "a b"): (
            f"{python} train.py --lr 3e-4 'a b'"
        ),
        _ran("run", "--", python, "-m", "json.tool", "--indent", "2"): (
            f"{python} -m json.tool --indent 2"
        ),
        submit("--wrap", wrapped): wrapped,
        submit("--wrap", f"{python} train.py --wrapped"): f"{python} train.py --wrapped",
        submit(str(script), "x y", "--z", "it's"): shlex.join([str(script), "x y", "--z", "it's"]),
    }
    for job_id, command in expected.items():
        assert _command(job_id) == command, (job_id, gq_ok("show", str(job_id)))
        assert json.loads(gq_ok("show", "--json", str(job_id)))["command"] == command
    ran = wait_state(next(iter(expected)), "COMPLETED")
    assert (tmp_path / f"gq-{ran['id']}.out").read_text() == "--nproc-per-node 2 ddp.py\n"
    # New arguments (gq update --args) change what it runs: its script and those, then.
    held = submit("--hold", str(script), "old")
    gq_ok("update", str(held), "--args", "new 'two words'")
    assert _command(held) == shlex.join([str(script), "new", "two words"])


def test_upgrade_to_0020_keeps_submissions_and_quotes_their_scripts_and_arguments(tmp_path):
    """A submission from before command lines were kept has none: gq show quotes its script
    and arguments as a shell would."""
    from gq.cli import render
    from gq.daemon.serving.handlers.common import job_info
    from gq.queue import lookups

    home = Home(tmp_path / "old").ensure()
    migrate(home, "0019")
    connection = sqlite3.connect(home.db)
    connection.execute(
        "INSERT INTO payloads (id, env, args, spool_bytes) VALUES (1, '{}', '[\"a b\", \"c\"]', 0)"
    )
    connection.execute(
        "INSERT INTO jobs (id, name, user, priority, gpus, exclusive, requeue, script, "
        "spool_path, workdir, stdout_path, stderr_path, submit_time, steps_done, attained, "
        "holds_lane, held, payload_id, uid, suspended, state, run_count) VALUES (3, 'a', "
        "'ann', 0, 1, 0, 0, '/w/s.sh', '', '/w', '/w/o', '/w/o', 1.0, 0, 0.0, 0, 0, 1, 1000, "
        "0, 'COMPLETED', 1)"
    )
    connection.commit()
    connection.close()
    database = Database(home)
    assert engine.current_revision(home.db) == HEAD_REVISION
    with database.read() as session:
        info = job_info(lookups.job(session, 3))
    assert info.command is None and info.args == ["a b", "c"]
    assert render.command_line(info) == "/w/s.sh 'a b' c"
    database.close()

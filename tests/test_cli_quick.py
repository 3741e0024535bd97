"""gq status, submit and run without typer (gq/cli/quick.py): the same options as the
typer commands, the same output, and typer left unimported."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from unittest import mock

import pytest

from gq import defaults
from gq.cli import quick
from gq.cli.quick import Kind

from conftest import (
    ROOT,
    gq,
    gq_ok,
    job,
    main_in_a_new_interpreter,
    submit,
    wait_state,
    write_script,
)


def _typer_options(name: str) -> tuple[dict[str, tuple[str, Kind]], dict[str, object]]:
    """The options of the typer command ``name``, as quick.OPTIONS spells them, and their
    defaults other than False and None (typer carries its own click: its classes are known
    here by their names)."""
    import typer

    from gq.cli.app import make_app

    group = typer.main.get_command(make_app(name))
    command = group.commands[name]
    found, defaults = {}, {}
    for param in command.params:
        if param.param_type_name != "option" or param.name == "help":
            continue
        if param.is_flag:
            kind = Kind.FLAG
        elif param.multiple:
            kind = Kind.LIST
        elif param.type.name == "int range" and param.type.min == 0 and param.type.max is None:
            kind = Kind.COUNT
        elif param.type.name == "int":
            kind = Kind.INT
        else:
            assert param.type.name == "str", (name, param.name, param.type.name)
            kind = Kind.VALUE
        for option in [*param.opts, *param.secondary_opts]:
            found[option] = (param.name, kind)
        if param.default is not None and param.default is not False:
            defaults[param.name] = param.default
    return found, defaults


@pytest.mark.parametrize("name", sorted(quick.OPTIONS))
def test_the_quick_options_are_the_typer_commands(name):
    assert (quick.OPTIONS[name], quick.DEFAULTS[name]) == _typer_options(name)


DEFAULTS = {
    "all_jobs": False,
    "json_out": False,
    "user": None,
    "state": None,
    "format_spec": None,
    "sort_spec": None,
    "limit": None,
    "start": False,
    "long": False,
    "array_tasks": False,
}


@pytest.mark.parametrize(
    "line, given",
    [
        ([], {}),
        (["--"], {}),
        (["-a", "--json"], {"all_jobs": True, "json_out": True}),
        (["-u", "root", "--user=bob", "-ucarol"], {"user": ["root", "bob", "carol"]}),
        (["-t", "PD,R", "--state", "CD"], {"state": ["PD,R", "CD"]}),
        (["-o", "%i %j", "--format=%u", "-S-p,i"], {"format_spec": "%u", "sort_spec": "-p,i"}),
        (["-S", "-p,i", "-u", "-a"], {"sort_spec": "-p,i", "user": ["-a"]}),
        (["--limit", "0", "--start", "-l", "--long"], {"limit": 0, "start": True, "long": True}),
        (["--limit=12"], {"limit": 12}),
        (["-r", "--array-tasks"], {"array_tasks": True}),
    ],
)
def test_status_lines_read_here(line, given):
    parsed = quick.parse(line, "status")
    assert parsed.params == {**DEFAULTS, **given}
    assert parsed.given == set(given)


@pytest.mark.parametrize(
    "line",
    [
        ["--help"],
        ["-h"],
        ["--bogus"],
        ["extra"],
        ["--", "extra"],
        ["-al"],
        ["-o"],
        ["--limit", "-1"],
        ["--limit", "x"],
        ["--limit"],
        ["--json=1"],
        ["--all=yes"],
        ["-"],
        ["--user", "root", "--usr", "bob"],
        ["-r=1"],
        ["--array-tasks=yes"],
        ["-rl"],
    ],
)
def test_status_lines_left_to_typer(line):
    assert quick.parse(line, "status") is None


def test_a_line_left_to_typer_gets_typers_error_and_help(daemon):
    result = gq("status", "--limit", "-1")
    assert result.code == 2 and "--limit" in result.err and result.err.count("\n") == 1
    assert "Usage: gq status" in gq_ok("status", "--help")
    result = gq("status", "-t", "NOPE")
    assert result.code == 2 and "NOPE" in result.err and result.err.count("\n") == 1


def test_status_prints_what_typer_would(daemon, tmp_path, monkeypatch):
    script = write_script(tmp_path / "held.sh", "true\n")
    ids = [submit("--hold", "-J", f"held{i}", str(script)) for i in range(3)]
    monkeypatch.delenv("GQ_STATUS_FORMAT", raising=False)
    for line in (
        ["status"],
        ["status", "-a"],
        ["status", "--json"],
        ["status", "-l"],
        ["status", "-r", "--json"],
        ["status", "--array-tasks"],
        ["status", "-o", "%.6i %j %t %R", "-S", "-i"],
        ["status", "-t", "PD", "-u", "nobody-here"],
    ):
        assert quick.parse(line[1:], "status") is not None
        quick_result = gq(*line)
        with mock.patch.object(quick, "run", return_value=None):  # typer's turn
            typer_result = gq(*line)
        assert quick_result == typer_result, line
        assert quick_result.code == 0
    listed = json.loads(gq_ok("status", "--json"))
    assert [job["id"] for job in listed] == ids
    lines = gq_ok("status", "-o", "%.6i %j %t %R", "-S", "-i").splitlines()
    assert [line.split() for line in lines[1:]] == [
        [str(job_id), f"held{i}", "PD", "JobHeldUser"]
        for i, job_id in reversed(list(enumerate(ids)))
    ]


def test_status_imports_no_typer(daemon, tmp_path):
    script = write_script(tmp_path / "held.sh", "true\n")
    job_id = submit("--hold", str(script))
    listing, imported_typer = main_in_a_new_interpreter("status", "--json")
    assert not imported_typer
    assert [job["id"] for job in json.loads("\n".join(listing))] == [job_id]


@pytest.mark.parametrize(
    "command, line, given, script, args",
    [
        (
            "submit",
            ["-G", "0", "-t", "5", "--priority", "-3", "train.py", "--lr", "3"],
            {"gpus": "0", "time_limit": "5", "priority": -3},
            "train.py",
            ["--lr", "3"],
        ),
        (
            "submit",
            ["-Jname", "--wrap=python x.py", "-H"],
            {"job_name": "name", "wrap": "python x.py", "hold": True},
            None,
            None,
        ),
        (
            "run",
            ["-W", "--", "python", "x.py", "-G", "1"],
            {"wait": True},
            "python",
            ["x.py", "-G", "1"],
        ),
        ("submit", ["job.sh", "-"], {}, "job.sh", ["-"]),
    ],
)
def test_submit_lines_read_here(command, line, given, script, args):
    parsed = quick.parse(line, command)
    assert parsed.given == set(given)
    assert {name: parsed.params[name] for name in given} == given
    assert (parsed.params["script"], parsed.params["args"]) == (script, args)
    assert parsed.params["output"] == "gq-%j.out" and parsed.params["oom"] == "requeue"


@pytest.mark.parametrize(
    "line",
    [
        ["-HW", "x.sh"],
        ["--priority", "high", "x.sh"],
        ["--help"],
        ["-G"],
        ["--hold=1", "x.sh"],
        ["--gpu", "1", "x.sh"],
        ["-Z", "x.sh"],
    ],
)
def test_submit_lines_left_to_typer(line):
    assert quick.parse(line, "submit") is None


SCRIPT = """#!/bin/bash
#GQ -J from-gq --priority 4
#SBATCH --time=10 --mem=2G
#SBATCH --partition=gpu
true
"""


def _shown(job_id: int) -> dict:
    shown = json.loads(gq_ok("show", "--json", str(job_id)))
    return {
        key: shown[key]
        for key in ("name", "priority", "time_limit", "host_mem", "gpus", "held", "script", "args")
    }


def test_submit_with_directives_queues_what_typer_would(daemon, tmp_path):
    script = write_script(tmp_path / "job.sh", SCRIPT)
    line = ["submit", "--parsable", "-H", "-t", "20", str(script), "a", "b"]
    assert quick.parse(line[1:], "submit") is not None
    by_quick = gq(*line)
    with mock.patch.object(quick, "run", return_value=None):  # typer's turn
        by_typer = gq(*line)
    assert by_quick.code == by_typer.code == 0, (by_quick, by_typer)
    assert by_quick.err == by_typer.err and "--partition" in by_quick.err
    first, second = int(by_quick.out), int(by_typer.out)
    assert second == first + 1
    assert (
        _shown(first)
        == _shown(second)
        == {
            "name": "from-gq",
            "priority": 4,
            "time_limit": 1200,
            "host_mem": 2 << 30,
            "gpus": 0,
            "held": True,
            "script": str(script),
            "args": ["a", "b"],
        }
    )


def test_a_directive_this_module_does_not_read_is_read_by_click(daemon, tmp_path):
    """-Hc1 (a flag and an option with its value in one token) and a typo: click reads
    them, the script having been read once."""
    script = write_script(
        tmp_path / "job.sh", "#!/bin/bash\n#SBATCH --time=10\n#GQ --bogus\ntrue\n"
    )
    assert quick.parse(["--bogus", str(script)], "submit") is None
    result = gq("submit", str(script))
    assert result.code == 2 and result.err.count("\n") == 1, result
    assert f"{script}:3: malformed #GQ directive" in result.err
    assert json.loads(gq_ok("status", "--all", "--json")) == []
    # #GQ lines are read before #SBATCH ones: the first error is the #GQ line's.
    both = write_script(
        tmp_path / "both.sh",
        "#!/bin/bash\n#SBATCH --partition=gpu\n#SBATCH -J\n#GQ --bogus\ntrue\n",
    )
    result = gq("submit", str(both))
    assert result.code == 2 and result.err.count("\n") == 1, result
    assert f"{both}:4: malformed #GQ directive" in result.err
    combined = write_script(tmp_path / "combined.sh", "#!/bin/bash\n#GQ -Hc1\ntrue\n")
    shown = json.loads(gq_ok("show", "--json", str(submit(str(combined)))))
    assert (shown["held"], shown["cpus_per_task"]) == (True, 1)
    assert "Usage: gq submit" in gq_ok("submit", "-h")  # the same process: -h still helps


def test_a_piped_script_is_read_once_whatever_its_directives(daemon, tmp_path):
    """A script given as /dev/stdin can be read only once: a directive the quick parser
    hands to click must not make anything read it again."""
    out = tmp_path / "piped.out"
    body = f"#!/bin/bash\n#GQ -Hc1 -J piped\necho hello from the pipe > {out}\n"
    code = (
        "import sys; from gq.cli.main import main; "
        "sys.exit(main(['submit', '--parsable', '/dev/stdin']))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        input=body,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    shown = json.loads(gq_ok("show", "--json", str(job_id)))
    assert (shown["name"], shown["held"], shown["cpus_per_task"]) == ("piped", True, 1)
    gq_ok("release", str(job_id))
    wait_state(job_id, "COMPLETED")
    assert out.read_text() == "hello from the pipe\n"


def test_a_test_only_directive_queues_nothing(daemon, tmp_path):
    """#GQ --test-only is read as every other directive is (sbatch reads #SBATCH
    --test-only so too)."""
    script = write_script(tmp_path / "job.sh", "#!/bin/bash\n#GQ --test-only\ntrue\n")
    result = gq("submit", str(script))
    assert result.code == 0 and "nothing was queued (--test-only)" in result.out, result
    assert json.loads(gq_ok("status", "--all", "--json")) == []


def test_ctrl_c_while_waiting_ends_quietly_with_130(daemon, tmp_path):
    script = write_script(tmp_path / "held.sh", "true\n")
    code = (
        "import sys; from gq.cli.main import main; "
        f"sys.exit(main(['submit', '--hold', '--wait', {str(script)!r}]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    waiting = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = waiting.stdout.readline()  # printed (and flushed) before it waits
        assert line.startswith("Submitted job "), line
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 130 and err == "", (waiting.returncode, err)
    gq_ok("cancel", line.split()[-1])


def test_submit_imports_no_typer(daemon, tmp_path):
    script = write_script(tmp_path / "job.sh", SCRIPT)
    (job_id,), imported_typer = main_in_a_new_interpreter("submit", "--parsable", "-H", str(script))
    assert not imported_typer
    assert _shown(int(job_id))["name"] == "from-gq"


# ----- what a plain status or submit costs: the modules it imports, the fields it sends -----
# Each of these takes a good part of Python's own start-up to import (bench/cli_latency.py
# measures the whole command against `python -c pass`).
SLOW_TO_IMPORT = {
    "typer",
    "typing",
    "dataclasses",
    "enum",
    "re",
    "json",
    "pathlib",
    "socket",
    "inspect",
    "datetime",
    "gq.messages",
    "gq.codec",
    "msgspec",
}


def _modules_imported_by(*line: str) -> tuple[set[str], str]:
    """The slow modules a command line imports, run in a fresh interpreter without site
    (whose .pth files import some of them first), and its output."""
    code = (
        "import sys\nfrom gq.cli.main import main\ncode = main(sys.argv[1:])\n"
        f"slow = set(sys.modules).intersection({sorted(SLOW_TO_IMPORT)!r})\n"
        "print(sorted(slow), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", code, *line],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stderr.strip().splitlines()[-1].replace("'", '"'))), result.stdout


def test_a_plain_status_and_submit_import_none_of_the_slow_modules(daemon, tmp_path):
    gq_ok("status")  # the daemon started
    script = write_script(tmp_path / "plain.sh", "true\n")
    imported, out = _modules_imported_by(
        "submit", "--parsable", "--priority", "3", "-H", str(script)
    )
    assert imported == set()
    job_id = int(out)
    imported, out = _modules_imported_by("status")
    assert imported == set()
    assert out.splitlines()[0].split() == [
        "JOBID",
        "NAME",
        "USER",
        "ST",
        "TIME",
        "DEVICE",
        "LANE",
        "PROGRESS",
        "REASON",
    ]
    assert out.splitlines()[1].split()[:4] == [str(job_id), "plain.sh", job(job_id)["user"], "PD"]
    # What a line needs beyond the plain one is imported for it alone (json imports re,
    # which imports enum).
    imported, _ = _modules_imported_by("status", "--json")
    assert imported == {"json", "re", "enum", "datetime"}


SUBMIT_LINES = [
    ["--parsable"],
    [
        "-G",
        "0",
        "-t",
        "1:00:00",
        "--gpu-mem",
        "2G",
        "--oom",
        "fail",
        "-J",
        "lean",
        "--priority",
        "5",
        "--steps",
        "10",
        "--begin",
        "now+1hour",
        "--signal",
        "B:10@60",
        "-w",
        "gpu0",
        "--retries",
        "2",
        "--retry-delay",
        "5",
        "--array",
        "0-3%2",
        "--after",
        "7",
        "-c",
        "2",
        "--mem-per-cpu",
        "1G",
        "-n",
        "2",
        "--exclusive",
        "--requeue",
        "-H",
        "-o",
        "out-%j.txt",
        "-e",
        "err.txt",
        "--deadline",
        "now+2hours",
        "--notify",
        "true",
        "--mail-type",
        "END",
        "--mail-user",
        "me",
    ],
    ["--gres", "gpu:a100:2", "--host-mem", "3G", "--dependency", "afterany:3"],
]


@pytest.mark.parametrize("options", SUBMIT_LINES)
def test_the_fields_a_submission_sends_are_the_typed_submit_message(options, tmp_path):
    """gq submit sends plain fields; decoded as the daemon decodes them they are a Submit
    with every option set as given: a field that one side renames, or that SubmitOptions
    gains, fails here."""
    from gq import codec, jsonline, messages
    from gq.cli import submit_request

    script = write_script(tmp_path / "job.py", "print(1)\n")
    parsed = quick.parse([*options, str(script), "arg"], "submit")
    fields = submit_request.build(parsed.params, script.read_bytes())
    line = jsonline.dumps({"v": defaults.PROTOCOL_VERSION, "kind": "submit", **fields})
    decoded = messages.decode(line.encode(), messages.REQUESTS)
    assert isinstance(decoded, messages.Submit) and decoded.script == script.read_bytes()
    assert set(fields["options"]) == {*messages.SubmitOptions.__struct_fields__}
    sent = codec.fields_of(decoded)
    assert sent.pop("v") == defaults.PROTOCOL_VERSION
    assert sent == {**fields, "test_only": False}


def _answering(tmp_path, monkeypatch, answer: bytes, fds: list[int] = ()) -> None:
    """A daemon socket at GQ_HOME that answers every request with ``answer`` (and the
    descriptors ``fds`` with it)."""
    root = tmp_path / "fake"
    root.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(root / "gq.sock"))
    listener.listen()

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(1 << 16)
                socket.send_fds(conn, [answer], list(fds))

    threading.Thread(target=serve, daemon=True).start()
    monkeypatch.setenv("GQ_HOME", str(root))
    from gq import client

    monkeypatch.setattr(client, "start_daemon", None)  # none is started


@pytest.mark.parametrize(
    "answer, fragment",
    [
        (
            b'{"v": %d, "kind": "error", "message": "refused: why", "exit_code": 2}',
            "gq: error: refused: why",
        ),
        (b'{"v": 99, "kind": "jobs", "jobs": []}', "the daemon speaks protocol version 99"),
        (b'{"v": %d, "kind": "jobs", "jobs": [', "malformed answer from the daemon"),
        (b'{"v": %d, "kind": "done", "message": "ok"}', "answered a 'list' request with 'done'"),
        (b'{"v": %d, "kind": "nonsense"}', "malformed answer from the daemon: unknown kind"),
    ],
)
def test_an_answer_status_does_not_expect_is_one_line_saying_what_is_wrong(
    answer, fragment, tmp_path, monkeypatch
):
    if b"%d" in answer:
        answer %= defaults.PROTOCOL_VERSION
    _answering(tmp_path, monkeypatch, answer + b"\n")
    result = gq("status")
    assert result.code == 2 and result.out == "", result
    assert result.err.count("\n") == 1 and fragment in result.err, result.err


def test_descriptors_passed_with_an_answer_no_command_expects_are_not_kept(tmp_path, monkeypatch):
    """Only gq logs takes a descriptor from the daemon; any other typed request leaves
    none open, whatever the answer carries."""
    from gq import client, messages

    read_end, write_end = os.pipe()
    _answering(
        tmp_path,
        monkeypatch,
        b'{"v": %d, "kind": "done", "message": "ok"}\n' % defaults.PROTOCOL_VERSION,
        [read_end, write_end],
    )
    pipe = os.readlink(f"/proc/self/fd/{read_end}")

    def ends_open() -> int:
        """Descriptors of this process on the pipe (counted by what they are: others open
        and close beside the test, as objects of earlier tests are collected)."""
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}") == pipe
            except OSError:
                pass
        return count

    assert ends_open() == 2
    for _ in range(3):
        assert client.ask(messages.GetPolicy()).message == "ok"
    assert ends_open() == 2
    os.close(read_end)
    os.close(write_end)


@pytest.mark.parametrize("given", ["rel/./a//b/", "~/x", "../up", "/abs//p/./q", "plain"])
def test_the_daemon_is_found_where_pathlib_would_find_it(given, tmp_path, monkeypatch):
    """The client finds its daemon's directory without pathlib; the directory, and the
    tag its jobs' cgroups go by, are those the daemon (with pathlib) works out."""
    from pathlib import Path

    from gq import home as homes

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GQ_HOME", given)
    found = homes.locate()
    assert found.root == Path(given).expanduser().absolute() == homes.personal().root
    assert Path(found.socket_path) == found.socket == found.root / "gq.sock"
    assert found == homes.Home(Path(given).expanduser().absolute())
    assert found.tag == homes.Home(found.root).tag
    monkeypatch.delenv("GQ_HOME")
    monkeypatch.setenv("GQ_SYSTEM_HOME", given.replace("~", "tilde"))
    assert homes.system().root == Path(given.replace("~", "tilde")).absolute()
    assert homes.system().system


def test_paths_above_a_link_are_the_links_and_a_deleted_directory_finds_the_daemon(
    daemon, tmp_path, monkeypatch
):
    """A submission keeps '..' as given (above a symbolic link is not the link's parent's),
    as pathlib did; a command run from a directory since deleted still finds its daemon
    (the working directory is looked up only for a relative path)."""
    from gq.cli import submit_request

    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "inner")
    script = write_script(tmp_path / "real" / "job.sh", "true\n")
    parsed = quick.parse(["-D", "link/..", "link/../job.sh"], "submit")
    fields = submit_request.build(parsed.params, script.read_bytes())
    assert (fields["workdir"], fields["script_path"]) == (
        f"{tmp_path}/link/..",
        f"{tmp_path}/link/../job.sh",
    )
    gq_ok("status")  # the daemon started (GQ_HOME is absolute)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    listed = gq("status")
    assert listed.code == 0 and listed.out.startswith("JOBID"), listed

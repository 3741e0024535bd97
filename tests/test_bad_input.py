"""Every kind of bad input: one line on stderr, exit code 2, and nothing written."""

from __future__ import annotations

import pytest

from conftest import all_jobs, gq, gq_ok, submit, write_script


def assert_refused(result, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.out, result.err)
    assert result.out == ""
    lines = result.err.strip().splitlines()
    if lines and lines[0].startswith("gq: started a personal daemon ("):
        lines = lines[1:]  # a test's first command started the daemon that refused it
    assert len(lines) == 1, result.err
    assert lines[0].startswith("gq: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def assert_nothing_written(home) -> None:
    assert all_jobs() == []
    spool = home / "spool"
    assert not spool.exists() or list(spool.iterdir()) == []


@pytest.fixture
def script(tmp_path):
    return write_script(tmp_path / "ok.sh", "true\n")


BAD_SUBMITS = [
    (["--mem", "6X"], "invalid size '6X'"),
    (["--mem", "-1G"], "invalid size '-1G'"),
    (["--mem", "0"], "must be greater than zero"),
    (["--time", "abc"], "invalid time limit 'abc'"),
    (["--time", "1:2:3:4"], "invalid time limit '1:2:3:4'"),
    (["--time", "0:00"], "must be greater than zero"),  # (a bare 0 is no limit, as in sbatch)
    (["--steps", "0"], "invalid --steps 0"),
    (["--steps", "-5"], "invalid --steps -5"),
    (["--gpus", "5"], "more than this node has"),
    (["--gpus", "-1"], "invalid --gpus -1"),
    (["--mem", "100T"], "more than any device of this node has"),
    (["--bogus"], "No such option: --bogus"),
    (["--priority", "high"], "Invalid value for '--priority'"),
    (["-D", "/no/such/dir"], "--chdir /no/such/dir is not a directory"),
    # Values no process or query downstream could carry: refused here, never stored.
    (["--priority", str(2**70)], "invalid --priority a 22-digit number"),
    (["--priority", "-2147483648"], "must be from -2147483647 to 2147483647"),
    (["--steps", str(2**63)], "invalid --steps"),
    (["--after", "99999999999999999999"], "job ids go from 1 to"),
    (["--dependency", "afterok:" + "9" * 5000], "invalid dependency"),
    (["--deadline", "now+1000000000000000000000seconds"], "between 1970 and the year 9999"),
    (["--deadline", "0001-01-01"], "between 1970 and the year 9999"),
    (["-J", "N" * 255, "-o", "%x" * 20], "over gq's limit of 4096"),
    (["--time", "9" * 40], "invalid time limit"),
    (["--mem", "9" * 5000], "invalid size"),
    (["-J", "evil\x1b[2J"], "must be printable text"),
    (["-J", "two\nlines"], "must be printable text"),
    (["-J", "x" * 300], "longer than 255 characters"),
    (["--array", "0-60000000"], "task ids go from 0 to 4000000"),
    (["-o", "a\udcffb.out"], "is not valid UTF-8"),
]


@pytest.mark.parametrize("options,message", BAD_SUBMITS, ids=[" ".join(o) for o, _ in BAD_SUBMITS])
def test_bad_submit_options(home, script, options, message):
    assert_refused(gq("submit", *options, str(script)), message)
    assert_nothing_written(home)


def test_missing_script(home, tmp_path):
    assert_refused(gq("submit", str(tmp_path / "nope.py")), "does not exist")
    assert_nothing_written(home)


def test_directory_as_script(home, tmp_path):
    assert_refused(gq("submit", str(tmp_path)), "is a directory")
    assert_nothing_written(home)


def test_unreadable_script(home):
    # Reading /proc/self/mem from its start fails (EIO) even for root, unlike chmod 000.
    assert_refused(gq("submit", "/proc/self/mem"), "cannot read script")
    assert_nothing_written(home)


def test_binary_script(home, tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00binary")
    assert_refused(gq("submit", str(binary)), "is a binary file")
    assert_nothing_written(home)


def test_missing_script_argument(home):
    assert_refused(gq("submit"), "give the script to run (or --wrap CMD")
    assert_nothing_written(home)


@pytest.mark.parametrize(
    "line",
    [
        "#GQ --mem",
        "#GQ --no-such-option 3",
        "#GQ mem=6G",
        "#GQ --time 'unterminated",
        "#GQ --mem 6G stray",
    ],
)
def test_malformed_directive(home, tmp_path, line):
    bad = write_script(tmp_path / "bad.sh", f"#!/bin/bash\n{line}\necho hi\n")
    assert_refused(gq("submit", str(bad)), f"{bad}:2: malformed #GQ directive")
    assert_nothing_written(home)


def test_directive_with_bad_value(home, tmp_path):
    bad = write_script(tmp_path / "badmem.sh", "#GQ --mem lots\necho hi\n")
    assert_refused(gq("submit", str(bad)), "invalid size 'lots'")
    assert_nothing_written(home)


def test_unknown_policy(home):
    assert_refused(gq("policy", "set", "lottery"), "unknown policy 'lottery'")
    assert gq_ok("policy", "show").startswith("fifo")
    assert_refused(gq("policy", "set", "priority", "--fill", "sometimes"), "unknown --fill")


@pytest.mark.parametrize(
    "value, words",
    [
        ("0", "from 50ms to 24h"),
        ("10ms", "from 50ms to 24h"),
        ("2days", "from 50ms to 24h"),
        ("-1", "from 50ms to 24h"),
        ("nan", "from 50ms to 24h"),
        ("inf", "from 50ms to 24h"),
        ("soon", "from 50ms to 24h"),
        (str(2**70), "from 50ms to 24h"),
        ("1\x00s", "from 50ms to 24h"),
    ],
)
def test_bad_max_hold_changes_nothing(home, value, words):
    gq_ok("policy", "set", "fair", "--max-hold", "3s")
    assert_refused(gq("policy", "set", "srtf", "--max-hold", value), "--max-hold", words)
    assert gq_ok("policy", "show").startswith("fair:") and "at most 3s" in gq_ok("policy", "show")


@pytest.mark.parametrize("value", [None, "2s", -1.0, 1e300, 2**70, [1], {"a": 1}, 0.01])
def test_the_daemon_refuses_a_hostile_max_hold_itself(daemon, value):
    """The client checks --max-hold; the daemon trusts no client: each such request is
    refused in one line and changes nothing (NaN never gets here: JSON has none)."""
    import json
    import socket

    from gq.defaults import PROTOCOL_VERSION

    request = {"v": PROTOCOL_VERSION, "kind": "policy-set", "name": "srtf", "max_hold": value}
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(daemon.root / "gq.sock"))
        sock.sendall(json.dumps(request).encode() + b"\n")
        answer = json.loads(sock.makefile("rb").readline())
    if value is None:  # null: as it is
        assert answer["kind"] == "done", answer
        return
    assert answer["kind"] == "error" and answer["exit_code"] == 2, answer
    assert "max_hold" in answer["message"], answer
    assert gq_ok("policy", "show").startswith("fifo:")


@pytest.mark.parametrize(
    "command",
    [["cancel", "999"], ["show", "999"], ["logs", "999"], ["cancel", "abc"], ["show", "17x"]],
)
def test_unknown_job_ids(home, command):
    result = gq(*command)
    assert_refused(result, "999" if "999" in command else "invalid job id")


def test_cancel_with_one_unknown_id_cancels_nothing(home, script):
    job_id = submit("--hold", str(script))
    assert_refused(gq("cancel", str(job_id), "4242"), "no job 4242")
    assert [j["state"] for j in all_jobs()] == ["PENDING"]


def test_bad_state_filter(home):
    assert_refused(gq("status", "--state", "SLEEPING"), "unknown job state 'SLEEPING'")


def test_unknown_command(home):
    assert_refused(gq("frobnicate"), "No such command")


def test_good_submit_after_bad_ones_gets_the_first_id(home, script):
    gq("submit", "--mem", "bad", str(script))
    assert submit(str(script)) == 1


def test_nul_in_a_directive_far_down_the_comment_block(home, tmp_path):
    """The #GQ line lies past the first 8 KiB (the binary check's window)."""
    script = tmp_path / "nul.sh"
    script.write_bytes(b"#!/bin/bash\n" + b"# padding\n" * 1000 + b"#GQ -J evil\x00name\necho\n")
    assert_refused(gq("submit", str(script)), "job name", "NUL")
    assert_nothing_written(home)


def test_non_utf8_name_and_directory(home, tmp_path, monkeypatch, script):
    import os

    assert_refused(gq("submit", "-J", os.fsdecode(b"caf\xe9"), str(script)), "not valid UTF-8")
    odd = tmp_path / os.fsdecode(b"dir-\xff")
    odd.mkdir()
    monkeypatch.chdir(odd)
    assert_refused(gq("submit", str(script)), "working directory", "not valid UTF-8")
    assert_nothing_written(home)


def test_environment_over_the_payload_limit(home, script, monkeypatch):
    monkeypatch.setenv("HUGE", "x" * (1400 << 10))  # 1.4 MB, past a launch message's frame
    assert_refused(gq("submit", str(script)), "over gq's limit of 256 KiB", "env -u NAME")
    monkeypatch.delenv("HUGE")
    monkeypatch.setenv("ODD", "\udcff")
    assert_refused(gq("submit", str(script)), "environment variable ODD is not valid UTF-8")
    assert_nothing_written(home)


@pytest.mark.parametrize(
    "command",
    [
        ["cancel", "99999999999999999999"],
        ["show", "1_99999999999"],
        ["hold", "9" * 400],
        ["update", "1", "--priority", str(2**64)],
    ],
)
def test_out_of_range_job_ids_and_values(home, command):
    result = gq(*command)
    assert result.code == 2 and result.out == "", result
    assert result.err.count("\n") == 1 and result.err.startswith("gq: error: "), result.err
    assert_nothing_written(home)


def test_a_gq_home_too_deep_for_its_sockets_is_one_line_and_starts_nothing(tmp_path, monkeypatch):
    """A unix socket's path has room for 107 bytes: in a deeper GQ_HOME a daemon started,
    never reached its hosts, and kept every job pending for ever (it logged "cannot reach
    the execution host of cpu: None" each second)."""
    deep = tmp_path / ("d" * (120 - len(str(tmp_path))))
    monkeypatch.setenv("GQ_HOME", str(deep))
    result = gq("status")
    assert result.code == 2 and result.out == "", result
    assert result.err.count("\n") == 1 and "too deep for its sockets" in result.err, result.err
    assert "choose a shorter GQ_HOME" in result.err
    assert not deep.exists()

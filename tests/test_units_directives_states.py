"""Unit tests of the pure parsers and the job state machine."""

from __future__ import annotations

import math

import pytest

from gq.cli import directives
from gq.errors import UserError
from gq.queue.states import ALLOWED, TERMINAL, JobState, allowed
from gq.units import (
    describe_period,
    format_duration,
    format_period,
    parse_duration,
    parse_period,
    parse_size,
)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("6G", 6 << 30),
        ("512M", 512 << 20),
        ("100K", 100 << 10),
        ("1T", 1 << 40),
        ("1.5G", int(1.5 * (1 << 30))),
        ("64", 64 << 20),
        ("2g", 2 << 30),
        ("4GB", 4 << 30),
        ("4GiB", 4 << 30),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "6X", "-1G", "0", "1.2.3G", "6 G B"])
def test_parse_size_rejects(text):
    with pytest.raises(UserError):
        parse_size(text)


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("30", 1800),
        ("1:30", 90),
        ("2:00:00", 7200),
        ("1-0", 86400),
        ("1-2:30", 95400),
        ("1-02:03:04", 93784),
        ("0:01", 1),
    ],
)
def test_parse_duration_slurm_forms(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "1:2:3:4", "1-", "-1", "0", "0:00", "1h"])
def test_parse_duration_rejects(text):
    with pytest.raises(UserError):
        parse_duration(text)


@pytest.mark.parametrize(
    "seconds,text",
    [(0, "0:00"), (59, "0:59"), (3600, "1:00:00"), (93784, "1-02:03:04"), (None, "-")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_directives_read_only_the_first_comment_block():
    text = (
        "#!/usr/bin/env python\n\n#GQ --mem 6G\n# plain comment\n#GQ -J 'my job'\n"
        "import os\n#GQ --priority 5\n"
    )
    found = directives.read(text, "t.py")
    assert [(d.line, d.tokens) for d in found] == [(3, ["--mem", "6G"]), (5, ["-J", "my job"])]
    assert all(d.prefix == "#GQ" for d in found)


def test_directive_prefix_must_stand_alone():
    assert directives.read("#GQX --mem 1G\n#GQ--mem 1G\n", "t.sh") == []


@pytest.mark.parametrize("line", ["#GQ", "#GQ mem=6G", "#GQ --time 'open", "#SBATCH x"])
def test_malformed_directives(line):
    with pytest.raises(UserError, match="t.sh:1: malformed #(GQ|SBATCH) directive"):
        directives.read(line + "\n", "t.sh")


def test_sbatch_directives_are_read_with_their_prefix():
    found = directives.read("#!/bin/bash\n#SBATCH --mem=4G # a comment\n#GQ -J x\n", "t.sh")
    assert [(d.prefix, d.tokens) for d in found] == [
        ("#SBATCH", ["--mem=4G"]),
        ("#GQ", ["-J", "x"]),
    ]


def test_terminal_states_leave_only_by_requeue():
    for state in TERMINAL:
        assert ALLOWED[state] == frozenset({JobState.PENDING})


def test_state_machine_edges():
    assert allowed(JobState.PENDING, JobState.RUNNING)
    assert allowed(JobState.RUNNING, JobState.PENDING)  # requeue
    assert not allowed(JobState.PENDING, JobState.COMPLETED)
    assert not allowed(JobState.COMPLETED, JobState.RUNNING)
    assert not allowed(JobState.CANCELLED, JobState.TIMEOUT)


@pytest.mark.parametrize(
    "text,state",
    [
        ("pd", JobState.PENDING),
        ("R", JobState.RUNNING),
        ("timeout", JobState.TIMEOUT),
        ("CA", JobState.CANCELLED),
    ],
)
def test_state_parse(text, state):
    assert JobState.parse(text) is state


@pytest.mark.parametrize(
    "text,seconds,back",
    [
        ("30days", 30 * 86400, "30days"),
        ("12h", 43200, "12hours"),
        ("90min", 5400, "90minutes"),
        ("1hour", 3600, "1hour"),
        ("2", 2 * 86400, "2days"),
        ("1.5s", 1.5, "1.5s"),
        ("never", math.inf, "never"),
    ],
)
def test_retention_periods(text, seconds, back):
    assert parse_period(text) == seconds and format_period(parse_period(text)) == back


@pytest.mark.parametrize(
    "seconds,said",
    [
        (30 * 86400, "30 days"),
        (86400, "1 day"),
        (43200, "12 hours"),
        (3600, "1 hour"),
        (5400, "90 minutes"),
        (60, "1 minute"),
        (90, "90 seconds"),
        (1, "1 second"),
        (1.5, "1.5 seconds"),
        (36 * 3600, "36 hours"),
    ],
)
def test_periods_as_people_write_them_read_back_the_same(seconds, said):
    assert describe_period(seconds) == said and parse_period(said) == seconds
    assert describe_period(math.inf) == "for ever"


@pytest.mark.parametrize("text", ["", "0", "-1d", "30 fortnights", "1" * 20, "d"])
def test_bad_retention_periods(text):
    with pytest.raises(UserError, match="invalid period"):
        parse_period(text)

"""Unit tests of the Slurm-compatible parsers: arrays, dependencies, #SBATCH translation."""

from __future__ import annotations

import pytest

from gq.cli.sbatch import translate
from gq.errors import UserError
from gq.queue import arrays, dependencies
from gq.queue.dependencies import Outcome, evaluate, parse
from gq.queue.states import JobState

CD, F, R, PD = JobState.COMPLETED, JobState.FAILED, JobState.RUNNING, JobState.PENDING


@pytest.mark.parametrize("text,tasks,limit", [
    ("0-9%2", tuple(range(10)), 2), ("1,3,5", (1, 3, 5), None), ("0-20:5", (0, 5, 10, 15, 20), None),
    ("7", (7,), None), ("0-3,10-11%4", (0, 1, 2, 3, 10, 11), 4),
])
def test_array_specs(text, tasks, limit):
    spec = arrays.parse(text)
    assert (spec.tasks(), spec.max_running) == (tasks, limit)


def test_array_size_is_known_before_expansion():
    spec = arrays.parse("0-3999999,5-9")
    assert spec.size == 4_000_005  # ranges, not lists: nothing was expanded to count them
    assert all(isinstance(part, range) for part in spec.ranges)


@pytest.mark.parametrize("text", ["", "a-b", "5-2", "0-9%0", "0-9%x", "1,,2", "0-4:0",
                                  "0-4000001", "0-60000000", "1" * 5000])
def test_bad_array_specs(text):
    with pytest.raises(UserError):
        arrays.parse(text)


def test_fold_tasks_like_squeue():
    assert arrays.fold([5, 6, 7, 9, 12, 13], 8) == "[5-7,9,12-13%8]"
    assert arrays.fold([3]) == "[3]"


def test_dependency_parse():
    dep = parse("afterok:3:4,afterany:5")
    assert not dep.any_of and dep.job_ids == {3, 4, 5}
    assert parse("afterok:3?afternotok:4").any_of


@pytest.mark.parametrize("text", ["afterok", "afterok:", "before:3", "afterok:x", "afterok:1,after:2?afterany:3",
                                  "afterok:0", "afterok:9223372036854775808", "afterok:" + "9" * 5000])
def test_bad_dependencies(text):
    with pytest.raises(UserError):
        parse(text)


@pytest.mark.parametrize("spec,runs,outcome", [
    ("afterok:1", {1: [(CD, True)]}, Outcome.SATISFIED),
    ("afterok:1", {1: [(F, True)]}, Outcome.NEVER),
    ("afterok:1", {1: [(R, True)]}, Outcome.WAITING),
    ("afternotok:1", {1: [(F, True)]}, Outcome.SATISFIED),
    ("afternotok:1", {1: [(CD, True)]}, Outcome.NEVER),
    ("afterany:1", {1: [(JobState.CANCELLED, False)]}, Outcome.SATISFIED),
    ("after:1", {1: [(R, True)]}, Outcome.SATISFIED),
    ("after:1", {1: [(PD, False)]}, Outcome.WAITING),
    ("afterok:1:2", {1: [(CD, True)], 2: [(R, True)]}, Outcome.WAITING),
    ("afterok:1,afterok:2", {1: [(CD, True)], 2: [(F, True)]}, Outcome.NEVER),
    ("afterok:1?afterok:2", {1: [(F, True)], 2: [(CD, True)]}, Outcome.SATISFIED),
    ("afterok:1?afterok:2", {1: [(F, True)], 2: [(R, True)]}, Outcome.WAITING),
    ("afterok:1", {1: [(CD, True), (R, True)]}, Outcome.WAITING),  # an array: every task
    ("afterok:1", {1: [(CD, True), (F, True)]}, Outcome.NEVER),
    ("afterok:9", {}, Outcome.NEVER),
])
def test_dependency_outcomes(spec, runs, outcome):
    assert evaluate(dependencies.parse(spec), runs) is outcome


@pytest.mark.parametrize("tokens,gq_tokens,ignored", [
    (["--mem=4G"], ["--mem", "4G"], []),
    (["-J", "train"], ["--job-name", "train"], []),
    (["-Jtrain"], ["--job-name", "train"], []),
    (["--gres=gpu:2"], ["--gpus", "2"], []),
    (["--gres=gpu:a100:3"], ["--gpus", "3"], []),
    (["--nice=5"], ["--priority", "-5"], []),
    (["--time=1:00:00", "--partition", "gpu"], ["--time", "1:00:00"], ["--partition"]),
    (["--nodes=2"], [], ["--nodes"]),
    (["--requeue"], ["--requeue"], []),
    (["-d", "afterok:4"], ["--dependency", "afterok:4"], []),
    (["--array=0-3%2"], ["--array", "0-3%2"], []),
])
def test_sbatch_translation(tokens, gq_tokens, ignored):
    assert translate(tokens) == (gq_tokens, ignored)

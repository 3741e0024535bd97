"""Unit tests of the Slurm-compatible parsers: arrays, dependencies, #SBATCH translation."""

from __future__ import annotations

import pytest

from gq.errors import UserError
from gq.queue import arrays, dependencies
from gq.queue.dependencies import Outcome, evaluate, parse
from gq.queue.states import JobState
from gq.slurm.options import translate

CD, F, R, PD = JobState.COMPLETED, JobState.FAILED, JobState.RUNNING, JobState.PENDING


@pytest.mark.parametrize(
    "text,tasks,limit",
    [
        ("0-9%2", tuple(range(10)), 2),
        ("1,3,5", (1, 3, 5), None),
        ("0-20:5", (0, 5, 10, 15, 20), None),
        ("7", (7,), None),
        ("0-3,10-11%4", (0, 1, 2, 3, 10, 11), 4),
    ],
)
def test_array_specs(text, tasks, limit):
    spec = arrays.parse(text)
    assert (spec.tasks(), spec.max_running) == (tasks, limit)


def test_array_size_is_known_before_expansion():
    spec = arrays.parse("0-3999999,5-9")
    assert spec.size == 4_000_005  # ranges, not lists: nothing was expanded to count them
    assert all(isinstance(part, range) for part in spec.ranges)


@pytest.mark.parametrize(
    "text",
    ["", "a-b", "5-2", "0-9%0", "0-9%x", "1,,2", "0-4:0", "0-4000001", "0-60000000", "1" * 5000],
)
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


@pytest.mark.parametrize(
    "text",
    [
        "afterok",
        "afterok:",
        "before:3",
        "afterok:x",
        "afterok:1,after:2?afterany:3",
        "afterok:0",
        "afterok:9223372036854775808",
        "afterok:" + "9" * 5000,
    ],
)
def test_bad_dependencies(text):
    with pytest.raises(UserError):
        parse(text)


@pytest.mark.parametrize(
    "spec,runs,outcome",
    [
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
    ],
)
def test_dependency_outcomes(spec, runs, outcome):
    assert evaluate(dependencies.parse(spec), runs) is outcome


@pytest.mark.parametrize(
    "tokens,gq_tokens,noticed",
    [
        (["--mem=4G"], ["--host-mem", "4G"], []),  # host memory, as on a cluster
        (["--mem=0"], ["--host-mem", "0"], []),
        (["--mem-per-cpu", "2G", "-c4"], ["--mem-per-cpu", "2G", "--cpus-per-task", "4"], []),
        (["-J", "train"], ["--job-name", "train"], []),
        (["-Jtrain"], ["--job-name", "train"], []),
        (["--gres=gpu:2"], ["--gres", "gpu:2"], []),
        (["--gres=gpu:a100:3,tmpfs:10G"], ["--gres", "gpu:a100:3"], ["--gres=tmpfs:10G"]),
        (
            ["--gpus=a100:1", "--gpus-per-node", "2"],
            ["--gpus", "a100:1", "--gpus-per-node", "2"],
            [],
        ),
        (["--nice=5"], ["--priority", "-5"], []),
        (["--nice"], ["--priority", "-100"], []),
        (["--time=UNLIMITED", "--partition", "gpu"], ["--time", "UNLIMITED"], ["--partition"]),
        (["--begin=now+1hour"], ["--begin", "now+1hour"], []),
        (["--nodes=1", "-w", "thisnode"], [], []),  # what gq runs anyway
        (["-w", "node07"], [], ["-w=node07"]),  # another node of a cluster: said, ignored
        (["-n", "4", "--ntasks-per-node=2"], ["--ntasks", "4", "--ntasks", "2"], []),
        (["--gpus-per-task=a100:1"], ["--gpus", "a100:1"], []),
        (["--nodes=2"], [], ["--nodes=2"]),
        (["--exclusive=user"], ["--exclusive"], []),
        (["--requeue"], ["--requeue"], []),
        (["-d", "afterok:4"], ["--dependency", "afterok:4"], []),
        (["--array=0-3%2"], ["--array", "0-3%2"], []),
    ],
)
def test_sbatch_translation(tokens, gq_tokens, noticed):
    out, notices = translate(tokens, node="thisnode")
    assert out == gq_tokens
    assert [n.split(" ")[0].rstrip(":") for n in notices] == noticed


def test_the_option_map_names_only_options_gq_submit_has():
    """Every gq option the map translates to is one of gq submit's, and every sbatch option
    gq submit shares by name means what the map says (the map is the one place)."""
    import typer.main

    from gq.cli.app import make_app
    from gq.slurm.options import BY_GQ, BY_SBATCH, OPTIONS

    command = typer.main.get_command(make_app("submit")).commands["submit"]
    flags = {flag for param in command.params for flag in param.opts}
    assert {option.gq for option in OPTIONS if option.gq} <= flags
    for flag in flags & set(BY_SBATCH):
        # gq's own --mem is the deprecated spelling of --gpu-mem; its -w names devices, where
        # sbatch's names a cluster's nodes.
        if flag not in ("--mem", "-w", "--nodelist"):
            assert BY_SBATCH[flag].gq is not None, flag
            assert flag in BY_SBATCH[flag].sbatch
    assert BY_SBATCH["--mem"].gq == "--host-mem" and BY_GQ["--host-mem"].sbatch == ("--mem",)


def test_sbatch_environment_on_one_node():
    from gq.slurm.environment import BatchJob, for_job, variables

    job = BatchJob(
        id=17,
        name="a b",
        user="ann",
        uid=1000,
        gid=1000,
        workdir="/w",
        run=2,
        cpus=4,
        host_mem=3 << 30,
        time_limit=60,
        devices=(0, 2),
        array_job_id=15,
        array_task_id=10,
        array_span=(3, 0, 10, 5),
    )
    env = variables(job, "node1")
    assert env["SLURM_JOB_ID"] == "10000000017" and env["SLURM_ARRAY_JOB_ID"] == "10000000015"
    assert (
        env["SLURM_ARRAY_TASK_COUNT"],
        env["SLURM_ARRAY_TASK_MIN"],
        env["SLURM_ARRAY_TASK_MAX"],
        env["SLURM_ARRAY_TASK_STEP"],
    ) == ("3", "0", "10", "5")
    assert (
        env["SLURM_CPUS_PER_TASK"],
        env["SLURM_MEM_PER_NODE"],
        env["SLURM_JOB_GPUS"],
        env["SLURM_RESTART_COUNT"],
        env["SLURM_JOB_NODELIST"],
    ) == ("4", "3072", "0,2", "1", "node1")
    inherited = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_SUBMIT_DIR": "/sub",
        "PATH": "/usr/bin",
        "HOME": "/h",
    }
    full = for_job(inherited, job, "node1", "/state/bin")
    assert "SLURM_STEP_ID" not in full and full["SLURM_JOB_ID"] == "10000000017"
    assert full["SLURM_SUBMIT_DIR"] == "/sub" and full["PATH"] == "/state/bin:/usr/bin"


def test_an_arrays_step_is_known_only_when_its_tasks_are_evenly_spaced(tmp_path):
    from gq.home import Home
    from gq.queue import lookups, submissions
    from gq.queue.engine import Database

    database = Database(Home(tmp_path / "q").ensure())
    spans = {}
    for spec in ("0-20:5", "1,2,5", "1,3,5", "7", "2,4"):
        new = submissions.NewJob(
            name="a",
            user="u",
            uid=1,
            gid=1,
            script="/s.sh",
            args=[],
            interpreter=None,
            workdir="/w",
            output_pattern="o",
            error_pattern="o",
            env={},
            array_tasks=arrays.parse(spec).tasks(),
        )
        with database.write() as session:
            first = submissions.submit(session, new, lambda *a: "/w/o")[0]
        with database.read() as session:
            spans[spec] = lookups.array_span(session, first)
    database.close()
    assert spans == {
        "0-20:5": (5, 0, 20, 5),
        "1,2,5": (3, 1, 5, 1),
        "1,3,5": (3, 1, 5, 2),
        "7": (1, 7, 7, 1),
        "2,4": (2, 2, 4, 2),
    }


def _info(**fields):
    from gq.messages import JobInfo

    base = dict(
        id=17,
        label="17",
        name="run12",
        user="ann",
        uid=1000,
        state="PENDING",
        reason=None,
        priority=0,
        gpus=1,
        mem=None,
        time_limit=None,
        deadline=None,
        steps_total=None,
        exclusive=False,
        requeue=False,
        dependency=None,
        held=False,
        array_job_id=None,
        array_task_id=None,
        array_max_running=None,
        script="/w/run.sh",
        args=["a b"],
        workdir="/w",
        stdout="/w/run12-17.out",
        stderr="/w/run12-17.out",
        device=None,
        lane=None,
        pid=None,
        submit_time=1.0,
        start_time=None,
        end_time=None,
        exit_code=None,
        run_count=0,
        steps_done=0,
        attained=0.0,
        mean_iteration=None,
        mem_persistent=None,
        mem_peak=None,
        holds_lane=False,
    )
    return JobInfo(**{**base, **fields})


def test_export_quotes_values_and_rebuilds_old_patterns_where_the_id_stands_alone():
    from gq.slurm.export import Exported, sbatch_script

    text, notes = sbatch_script(Exported(_info(), "echo hi\n"))
    assert "#SBATCH --output=run12-%j.out" in text  # not run%j-12 (the 12 is the name's)
    text, _ = sbatch_script(
        Exported(
            _info(name='my "job"', workdir="/dir with space", output_pattern="%x-%j.out"), "echo\n"
        )
    )
    assert '#SBATCH --job-name="my \\"job\\""' in text
    assert '#SBATCH --chdir="/dir with space"' in text and "--output=%x-%j.out" in text
    assert "bash \"$script\" 'a b'" in text and any("inlined" in n for n in notes)
    text, _ = sbatch_script(
        Exported(_info(output_pattern="gq-%j.out"), "echo\n", script_unchanged=True)
    )
    assert "--output" not in text  # Slurm's own default, never gq's files of the same id
    assert "exec bash /w/run.sh 'a b'" in text
    text, _ = sbatch_script(Exported(_info(), "#!/usr/bin/env bash\necho\n", script_unchanged=True))
    assert "exec /usr/bin/env bash /w/run.sh 'a b'" in text  # as the kernel would run it


def test_export_refuses_a_value_that_would_end_its_sbatch_line():
    from gq.errors import UserError
    from gq.slurm.export import Exported, sbatch_script

    with pytest.raises(UserError, match="no #SBATCH line can carry"):
        sbatch_script(Exported(_info(workdir="/w\nrm -rf ~"), "echo\n"))
    text, _ = sbatch_script(
        Exported(_info(script="/w/a\nrm -rf ~.sh"), "echo\n", script_unchanged=True)
    )
    assert "\nrm -rf" not in text.replace("'/w/a\nrm -rf ~.sh'", "")  # only quoted, as an arg


def test_export_of_a_chain_needs_every_prerequisite():
    from gq.errors import UserError
    from gq.slurm.export import Exported, submitter

    first = Exported(_info(id=3, label="3"), "true\n", script_unchanged=True)
    second = Exported(
        _info(id=4, label="4", dependency="afterok:3?afterany:9"), "true\n", script_unchanged=True
    )
    with pytest.raises(UserError, match=r"depends on job\(s\) 9"):
        submitter([first, second])
    second = Exported(
        _info(id=4, label="4", dependency="afterok:3"), "true\n", script_unchanged=True
    )
    text, _ = submitter([second, first])
    assert text.index("job_3=$(sbatch") < text.index(
        'job_4=$(sbatch --parsable "--dependency=afterok:${job_3}"'
    )

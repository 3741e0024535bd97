"""gq's scontrol inside real jobs: a job shows, requeues and shortens itself as it would on
a cluster, and is refused anything else, with one line and a non-zero exit."""

from __future__ import annotations

import os
import socket

import pytest

from gq.slurm import scontrol
from gq.slurm.environment import slurm_id

from conftest import all_jobs, gq_ok, job, submit, wait_state, write_script


def test_a_job_shows_itself_as_scontrol_does_whatever_python_path_it_has(daemon, tmp_path):
    """Its fields as Slurm spells them, in both id spellings of an array task; the shim
    answers although the job's PYTHONPATH holds a gq that cannot be imported."""
    trap = tmp_path / "trap" / "gq"
    trap.mkdir(parents=True)
    (trap / "__init__.py").write_text("raise ImportError('not this gq')\n")
    script = write_script(
        tmp_path / "me.sh",
        (
            f"export PYTHONPATH={trap.parent}\n"
            "show=show-$SLURM_ARRAY_TASK_ID.txt\n"
            'scontrol show job $SLURM_JOB_ID > $show; echo "show: $?"\n'
            "grep -q JobState=RUNNING $show && echo running\n"
            "scontrol show job -o ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} | wc -l\n"
            'scontrol update JobId=$SLURM_JOB_ID TimeLimit=4:00; echo "update: $?"\n'
            "scontrol show job $SLURM_JOB_ID | grep -o 'TimeLimit=[^ ]*'\n"
            "scontrol show hostnames\n"
            "scontrol show hostnames 'gpu[08-10],cpu7'\n"
        ),
    )
    # Its first task's id is its array's, which 'gq show' answers with every task.
    array = submit("-t", "5", "--array", "3-4%1", "-J", "myself", str(script))
    task = next(j for j in all_jobs() if j["array_job_id"] == array and j["array_task_id"] == 3)
    assert task["id"] == array
    wait_state(task["id"], "COMPLETED")
    node = socket.gethostname().split(".")[0]
    out = (tmp_path / f"gq-{task['id']}.out").read_text()
    assert out.splitlines() == [
        "show: 0",
        "running",
        "1",
        "update: 0",
        "TimeLimit=00:04:00",
        node,
        "gpu08",
        "gpu09",
        "gpu10",
        "cpu7",
    ]
    shown = (tmp_path / "show-3.txt").read_text()
    fields = dict(field.split("=", 1) for field in shown.split())
    assert fields["JobId"] == slurm_id(task["id"]) and fields["JobName"] == "myself"
    assert fields["ArrayJobId"] == slurm_id(array) and fields["ArrayTaskId"] == "3"
    assert fields["UserId"] == f"{task['user']}({os.getuid()})"
    assert (fields["Reason"], fields["Restarts"], fields["TimeLimit"]) == ("None", "0", "00:05:00")
    assert fields["RunTime"].startswith("00:00:") and fields["EndTime"] != "Unknown"
    assert (fields["NumNodes"], fields["NodeList"]) == ("1", node)
    assert fields["WorkDir"] == str(tmp_path) and fields["Command"] == str(script)
    assert fields["StdOut"] == fields["StdErr"] == str(tmp_path / f"gq-{task['id']}.out")
    assert shown.startswith(f"JobId={slurm_id(task['id'])} ") and "\n   UserId=" in shown
    assert job(task["id"])["time_limit"] == 240  # lowered by the job itself


def test_scontrol_refuses_other_jobs_other_verbs_and_bad_values(daemon, tmp_path):
    """Each refusal one line on stderr and exit 1; the other job is left as it was."""
    other = submit("--hold", "-t", "5", str(write_script(tmp_path / "o.sh", "true\n")))
    tried = [
        f"requeue {slurm_id(other)}",
        f"requeue {other}",
        f"show job {slurm_id(other)}",
        "show job",
        f"update JobId={slurm_id(other)} TimeLimit=1",
        "update JobId=$SLURM_JOB_ID Partition=big",
        "update JobId=$SLURM_JOB_ID",
        "shutdown",
        "reconfigure",
        "show partition",
        "cancel $SLURM_JOB_ID",
        "show hostnames n[1-100000]",
        "show hostnames n[1-",
        "show hostnames n[3-1]",
        "update JobId=$SLURM_JOB_ID TimeLimit=soon",
        "requeue",
    ]
    script = write_script(
        tmp_path / "try.sh",
        "".join(
            f'scontrol {args} > out 2> err; echo "$? $(wc -l < out) $(wc -l < err) $(cat err)"\n'
            for args in tried
        ),
    )
    tester = submit("-t", "5", str(script))
    wait_state(tester, "COMPLETED")
    lines = (tmp_path / f"gq-{tester}.out").read_text().splitlines()
    assert len(lines) == len(tried)
    for args, line in zip(tried, lines):
        assert line.startswith("1 0 1 scontrol (gq): "), (args, line)
    assert "is not this job" in lines[0] and "is not this job" in lines[1]
    assert "not understood" in lines[7]
    assert "more than 10000 hosts" in lines[11]
    assert "invalid time limit 'soon'" in lines[14]
    untouched = job(other)
    assert (untouched["state"], untouched["time_limit"], untouched["run_count"]) == (
        "PENDING",
        300,
        0,
    )
    assert job(tester)["time_limit"] == 300
    gq_ok("cancel", str(other))


def test_a_job_requeues_itself_and_completes_on_its_second_run(daemon, tmp_path):
    script = write_script(
        tmp_path / "again.sh",
        (
            'echo "run ${SLURM_RESTART_COUNT:-0}"\n'
            'if [ -z "$SLURM_RESTART_COUNT" ]; then\n'
            "    scontrol requeue $SLURM_JOB_ID\n"
            "    sleep 60; echo never\n"
            "fi\n"
            "scontrol show job $SLURM_JOB_ID | grep -o 'Restarts=[0-9]*'\n"
        ),
    )
    job_id = submit("--requeue", str(script))
    info = wait_state(job_id, "COMPLETED", timeout=60)
    assert info["run_count"] == 2
    assert (tmp_path / f"gq-{job_id}.out").read_text().splitlines() == [
        "run 0",
        "run 1",
        "Restarts=1",
    ]


@pytest.mark.parametrize(
    "argv, words",
    [
        ([], "inside a gq job scontrol understands"),
        (["requeue", "17", "18"], "not understood"),
        (["show", "job", "10000000017_1"], "is not this job"),
        (["update", "JobId=10000000005", "TimeLimit=1", "Nice=5"], "only JobId=ID TimeLimit"),
        (["update", "TimeLimit", "JobId=10000000005"], "is not KEY=VALUE"),
        (["show", "hostnames", "a,,b"], "an empty name"),
        (["show", "hostnames", "a[1-2]]"], "unbalanced brackets"),
        (["show", "hostnames", "a[1-99999999999]"], "is not a range"),
    ],
)
def test_hostile_arguments_are_refused_before_any_request(argv, words):
    own = scontrol.own_job({"GQ_JOB_ID": "5"})
    with pytest.raises(scontrol.Refusal, match=words.replace("[", r"\[")):
        command = scontrol.parse(argv, own)
        if isinstance(command, scontrol.ShowHostnames):
            scontrol.expand_hostlist(command.hostlist)


def test_hostlists_expand_as_slurm_expands_them():
    assert scontrol.expand_hostlist("n[1-3,07]x[0-1],solo") == [
        "n1x0",
        "n1x1",
        "n2x0",
        "n2x1",
        "n3x0",
        "n3x1",
        "n07x0",
        "n07x1",
        "solo",
    ]
    own = scontrol.own_job({"GQ_JOB_ID": "5", "GQ_ARRAY_JOB_ID": "4", "GQ_ARRAY_TASK_ID": "1"})
    assert own.spellings == {"5", "10000000005", "4_1", "10000000004_1"}
    with pytest.raises(scontrol.Refusal, match="runs only inside a gq job"):
        scontrol.own_job({"GQ_JOB_ID": "5; rm -rf /"})


def test_on_a_shared_node_scontrol_runs_as_the_job_and_acts_on_its_jobs_alone(shared_node, users):
    """alice's job shows itself as hers; naming bob's job, even with its GQ_JOB_ID forged,
    is refused by the daemon (she does not own it), as is raising her own limit, which only
    an operator may; bob's job runs on untouched."""
    alice, bob = users["alice"], users["bob"]
    hold = write_script(bob.workdir / "hold.sh", "sleep 300\n")
    os.chown(hold, bob.uid, bob.gid)
    theirs = int(shared_node.ok(bob, "submit", "--parsable", "-t", "10", hold).strip())
    shared_node.wait_state(theirs, "RUNNING")
    script = write_script(
        alice.workdir / "try.sh",
        (
            "scontrol show job $SLURM_JOB_ID | grep -o 'UserId=[^ ]*'\n"
            f"GQ_JOB_ID={theirs} scontrol requeue {slurm_id(theirs)} 2> err; "
            'echo "requeue: $? $(cat err)"\n'
            'scontrol update JobId=$SLURM_JOB_ID TimeLimit=20 2> err; echo "raise: $? $(cat err)"\n'
        ),
    )
    os.chown(script, alice.uid, alice.gid)
    mine = int(shared_node.ok(alice, "submit", "--parsable", "-t", "10", script).strip())
    shared_node.wait_state(mine, "COMPLETED", "FAILED")
    lines = (alice.workdir / f"gq-{mine}.out").read_text().splitlines()
    assert lines[0] == f"UserId={alice.name}({alice.uid})"
    assert lines[1].startswith("requeue: 1 scontrol (gq): ") and "requeue" in lines[1], lines
    assert lines[2].startswith("raise: 1 scontrol (gq): ") and "operator" in lines[2], lines
    info = shared_node.job(theirs)
    assert (info["state"], info["run_count"]) == ("RUNNING", 1)
    assert shared_node.job(mine)["time_limit"] == 600
    shared_node.ok(None, "cancel", theirs)

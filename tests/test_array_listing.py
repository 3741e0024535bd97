"""gq status with job arrays, through the real CLI and daemon: an array's pending tasks that
never started are one line (squeue's 17_[5-99%8]) and one JSON object, whatever their number;
--array-tasks (-r) lists each; the filters see folded and unfolded tasks alike."""

from __future__ import annotations

import getpass
import json

from conftest import all_jobs, gq_ok, submit, wait_state, write_script

JSON_FIELDS = (
    "id",
    "job_id",
    "state",
    "reason",
    "array_job_id",
    "array_task_id",
    "array_task_string",
    "array_task_count",
    "array_max_running",
)


def _rows(*options: str) -> list[list[str]]:
    """gq status's lines under its header, as JOBID, ST and REASON."""
    lines = gq_ok("status", "-o", "%i %t %R", *options).splitlines()[1:]
    return [(line.split(maxsplit=2) + ["", ""])[:3] for line in lines]


def _objects(*options: str) -> list[dict]:
    return [
        {key: entry[key] for key in JSON_FIELDS}
        for entry in json.loads(gq_ok("status", "--json", *options))
    ]


def test_pending_tasks_fold_into_one_line_each_listed_with_array_tasks(daemon, tmp_path):
    go = tmp_path / "go"
    script = write_script(
        tmp_path / "task.sh",
        f'if [ "$GQ_ARRAY_TASK_ID" != 0 ]; then while [ ! -e {go} ]; do sleep 0.05; done; fi\n',
    )
    plain = submit(str(write_script(tmp_path / "plain.sh", "true\n")))
    wait_state(plain, "COMPLETED")
    array = submit("--hold", "--array", "0-5%1", str(script))
    ids = {j["array_task_id"]: j["id"] for j in all_jobs() if j["array_job_id"] == array}
    assert sorted(ids) == list(range(6)) and ids[0] == array

    assert _rows() == [[f"{array}_[0-5%1]", "PD", "JobHeldUser"]]
    gq_ok("release", f"{array}_0")
    wait_state(ids[0], "COMPLETED")
    gq_ok("release", f"{array}_1")
    wait_state(ids[1], "RUNNING")
    gq_ok("requeue", f"{array}_0")  # pending again; the %1 limit keeps it from starting
    gq_ok("hold", f"{array}_0")
    gq_ok("update", f"{array}_3", "--priority", "5")

    # A task that ran before, or that differs from its array's others, has a line of its own.
    assert _rows() == [
        [f"{array}_0", "PD", "JobHeldUser"],
        [f"{array}_1", "R", ""],
        [f"{array}_[2,4-5%1]", "PD", "JobHeldUser"],
        [f"{array}_3", "PD", "JobHeldUser"],
    ]
    each = [
        [f"{array}_{task}", "R" if task == 1 else "PD", "" if task == 1 else "JobHeldUser"]
        for task in range(6)
    ]
    assert _rows("--array-tasks") == _rows("-r") == each
    plain_row = [str(plain), "CD", ""]
    assert _rows("--all") == [plain_row, *_rows()]
    assert _rows("--all", "-r") == [plain_row, *each]
    assert _rows("--state", "PD") == [row for row in _rows() if row[1] == "PD"]
    assert _rows("--state", "PD", "-r") == [row for row in each if row[1] == "PD"]
    assert _rows("--state", "R") == _rows("--state", "R", "-r") == [[f"{array}_1", "R", ""]]
    assert _rows("--user", getpass.getuser()) == _rows()
    assert _rows("--user", "nobody-here") == _rows("--user", "nobody-here", "-r") == []

    folded = {
        "id": ids[2],
        "job_id": f"{array}_[2,4-5%1]",
        "state": "PENDING",
        "reason": "JobHeldUser",
        "array_job_id": array,
        "array_task_id": None,
        "array_task_string": "2,4-5",
        "array_task_count": 3,
        "array_max_running": 1,
    }

    def alone(task: int, state: str = "PENDING", reason: str | None = "JobHeldUser") -> dict:
        return {
            "id": ids[task],
            "job_id": f"{array}_{task}",
            "state": state,
            "reason": reason,
            "array_job_id": array,
            "array_task_id": task,
            "array_task_string": None,
            "array_task_count": None,
            "array_max_running": 1,
        }

    running = alone(1, "RUNNING", None)
    assert _objects() == [alone(0), running, folded, alone(3)]
    assert _objects("-r") == [alone(0), running, alone(2), alone(3), alone(4), alone(5)]
    assert _objects("--state", "PD") == [alone(0), folded, alone(3)]
    shown = json.loads(gq_ok("status", "--json"))[2]
    assert shown["name"] == "task.sh" and shown["priority"] == 0 and shown["held"]
    go.touch()
    gq_ok("cancel", str(array))


def test_a_big_array_lists_as_one_line_and_one_object(home, tmp_path):
    """3,000 held tasks: one line, one JSON object that counts them; each with -r."""
    from conftest import DaemonControl

    DaemonControl(home).start("--max-array", "3000", "--max-pending", "3000")
    array = submit("--hold", "--array", "0-2999", str(write_script(tmp_path / "s.sh", "true\n")))
    assert _rows() == [[f"{array}_[0-2999]", "PD", "JobHeldUser"]]
    (listed,) = json.loads(gq_ok("status", "--json"))
    assert (listed["job_id"], listed["array_task_string"], listed["array_task_count"]) == (
        f"{array}_[0-2999]",
        "0-2999",
        3000,
    )
    every = json.loads(gq_ok("status", "--json", "--array-tasks"))
    assert [task["array_task_id"] for task in every] == list(range(3000))
    gq_ok("cancel", str(array))

"""The demo's tables, from gq's own figures (`gq history --json` on stdin).

  gq history --json | python3 demo_table.py jct fifo=1,2,3 srtf=4,5,6
  gq history --json | python3 demo_table.py makespan "--lanes 1=7,8" "--lanes auto=9,10"

jct: each job's JCT (its end less its submission) under each run of the same jobs, a
column a run, a row a job name. makespan: each run's first submission to its last end,
and how many times faster each run is than the first.
"""

import json
import sys
from datetime import datetime


def runs(specs: list[str]) -> list[tuple[str, list[int]]]:
    """'LABEL=ID,ID,...' each: the label and its job ids, in order."""
    parsed = []
    for spec in specs:
        label, _, ids = spec.rpartition("=")
        parsed.append((label, [int(i) for i in ids.split(",")]))
    return parsed


def jct_table(jobs: dict[int, dict], columns: list[tuple[str, list[int]]]) -> None:
    # The same jobs in the same order under each label: the first run's names label rows.
    names = [jobs[i]["name"] for i in columns[0][1]]
    width = max(len(n) for n in [*names, "average"])
    print(f"{'JCT (s)':<{width}}" + "".join(f"{label:>10}" for label, _ in columns))
    for row, name in enumerate(names):
        cells = "".join(f"{jobs[ids[row]]['jct']:>10.1f}" for _, ids in columns)
        print(f"{name:<{width}}{cells}")
    averages = [sum(jobs[i]["jct"] for i in ids) / len(ids) for _, ids in columns]
    print(f"{'average':<{width}}" + "".join(f"{a:>10.1f}" for a in averages))


def makespan_table(jobs: dict[int, dict], columns: list[tuple[str, list[int]]]) -> None:
    def makespan(ids: list[int]) -> float:
        start = min(datetime.fromisoformat(jobs[i]["submit_time"]) for i in ids)
        end = max(datetime.fromisoformat(jobs[i]["end_time"]) for i in ids)
        return (end - start).total_seconds()

    spans = [(label, makespan(ids)) for label, ids in columns]
    width = max(len(label) for label, _ in spans)
    for label, span in spans:
        print(f"{label:<{width}}  makespan {span:5.1f} s  ({spans[0][1] / span:.2f}x)")


def main() -> None:
    kind, columns = sys.argv[1], runs(sys.argv[2:])
    jobs = {job["id"]: job for job in json.load(sys.stdin)}
    missing = [i for _, ids in columns for i in ids if i not in jobs]
    if missing:
        sys.exit(f"demo_table: no finished job {missing[0]} in gq history")
    {"jct": jct_table, "makespan": makespan_table}[kind](jobs, columns)


if __name__ == "__main__":
    main()

"""SQLAlchemy models of the queue. Rows of `jobs` are written only by `submissions.py`,
`transitions.py`, `job_updates.py`, `spool_usage.py` (a dropped snapshot's path) and
`purging.py`."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    # Every model here is mapped to a table of its own (DeclarativeBase allows any
    # FromClause), so the Core statements built on one are typed as a table's.
    __table__: ClassVar[Table]


class Payload(Base):
    """What one submission runs with, stored once however many tasks it has."""

    __tablename__ = "payloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    env: Mapped[dict[str, str]] = mapped_column(JSON, deferred=True)  # read at launch only
    args: Mapped[list[str]] = mapped_column(JSON)
    # What its snapshot costs the spool while kept (spool.footprint; 0 once dropped): what
    # counts against its user's --max-spool.
    spool_bytes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The command line the user gave, as a shell reads it (gq run -- CMD ARGS, --wrap's,
    # SCRIPT ARGS); None for submissions from before it was kept, and once gq update has
    # given new arguments (the script and its arguments say it then).
    command: Mapped[str | None] = mapped_column(Text)


class SpoolUsage(Base):
    """What the spool keeps for each user's jobs (the sum of their payloads' spool_bytes),
    kept up to date by spool_usage.py so that a submit checks --max-spool in one read."""

    __tablename__ = "spool_usage"

    uid: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    bytes: Mapped[int] = mapped_column(Integer, default=0)


class UserUsage(Base):
    """A user's lane time, decayed with the node's fair-share half-life: ``usage`` seconds as
    of ``updated`` (seconds since the epoch). Kept across jobs and restarts."""

    __tablename__ = "user_usage"
    user: Mapped[str] = mapped_column(String(64), primary_key=True)
    usage: Mapped[float] = mapped_column(Float)
    updated: Mapped[float] = mapped_column(Float)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_user_state", "user", "state"),
        Index("ix_jobs_uid_payload", "uid", "payload_id"),  # old snapshots
        # a user's recent runs of one name, for forecasts
        Index("ix_jobs_user_name_end", "user", "name", "end_time"),
        # a user's history (--user), the last ended first
        Index("ix_jobs_user_end", "user", "end_time"),
        {"sqlite_autoincrement": True},
    )  # ids are never given twice

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    user: Mapped[str] = mapped_column(String(64), index=True)
    uid: Mapped[int | None] = mapped_column(Integer)  # the submitter, as the kernel said
    gid: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer, default=0)

    # What the job asked for.
    gpus: Mapped[int] = mapped_column(Integer, default=1)
    mem: Mapped[int | None] = mapped_column(Integer)  # device memory (--gpu-mem)
    # Where ``mem`` came from (messages.MemoryBasis): None as the user declared it, or
    # measured by its probe, or raised after it ran out of memory.
    mem_basis: Mapped[str | None] = mapped_column(String(16))
    on_oom: Mapped[str | None] = mapped_column(String(16))  # --oom requeue|fail (None: requeue)
    # How many of its runs ran out of memory.
    ooms: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    host_mem: Mapped[int | None] = mapped_column(Integer)  # bytes; its cgroup's limit
    cpus: Mapped[int | None] = mapped_column(Integer)  # --cpus-per-task
    gpu_type: Mapped[str | None] = mapped_column(Text)  # --gpus TYPE:N, matched to models
    begin_time: Mapped[float | None] = mapped_column(Float)  # not started before (--begin)
    warn_signal: Mapped[str | None] = mapped_column(String(32))  # --signal, [B:]NUM@SECONDS
    nodelist: Mapped[str | None] = mapped_column(Text)  # -w: the devices it may run on
    retries: Mapped[int | None] = mapped_column(Integer)  # a failed run is run again so often
    retries_left: Mapped[int | None] = mapped_column(Integer)  # again from a gq requeue
    retry_delay: Mapped[float | None] = mapped_column(Float)  # seconds before each retry
    ntasks: Mapped[int | None] = mapped_column(Integer)  # -n: the tasks its srun starts
    notify: Mapped[str | None] = mapped_column(Text)  # --notify: run as its owner at its end
    mail_type: Mapped[str | None] = mapped_column(String(64))  # BEGIN,END,FAIL,REQUEUE,ALL
    mail_user: Mapped[str | None] = mapped_column(Text)
    suspended: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Suspended by the daemon for a higher-priority job, its memory in host memory (a
    # run's own: it ends with the run, as ``suspended`` does).
    preempted: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    time_limit: Mapped[int | None] = mapped_column(Integer)
    deadline: Mapped[float | None] = mapped_column(Float)  # seconds since the epoch
    steps_total: Mapped[int | None] = mapped_column(Integer)
    exclusive: Mapped[bool] = mapped_column(Boolean, default=False)
    requeue: Mapped[bool] = mapped_column(Boolean, default=False)
    dependency: Mapped[str | None] = mapped_column(Text)  # sbatch syntax, e.g. afterok:3:4
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    # gq run --pty: it runs on a terminal its submitter's gq holds; its output is that
    # terminal's unless -o/-e name files (its stdout_path and stderr_path are "" then).
    interactive: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    idle_timeout: Mapped[int | None] = mapped_column(Integer)  # seconds (interactive jobs)

    # Job arrays: every task is a row; the array's id is its first task's id.
    array_job_id: Mapped[int | None] = mapped_column(Integer, index=True)
    array_task_id: Mapped[int | None] = mapped_column(Integer)
    array_max_running: Mapped[int | None] = mapped_column(Integer)

    # How to run it.
    script: Mapped[str] = mapped_column(Text)
    spool_path: Mapped[str] = mapped_column(Text)
    payload_id: Mapped[int] = mapped_column(ForeignKey("payloads.id"), index=True)
    payload: Mapped[Payload] = relationship(lazy="selectin")
    interpreter: Mapped[str | None] = mapped_column(Text)
    workdir: Mapped[str] = mapped_column(Text)
    stdout_path: Mapped[str] = mapped_column(Text)
    stderr_path: Mapped[str] = mapped_column(Text)
    output_pattern: Mapped[str | None] = mapped_column(Text)  # -o as given (%x-%j.out)
    error_pattern: Mapped[str | None] = mapped_column(Text)
    umask: Mapped[int] = mapped_column(Integer, default=0o022)

    # What happened.
    device: Mapped[str | None] = mapped_column(String(64))
    lane: Mapped[int | None] = mapped_column(Integer)
    pid: Mapped[int | None] = mapped_column(Integer)
    submit_time: Mapped[float] = mapped_column(Float)
    start_time: Mapped[float | None] = mapped_column(Float)
    end_time: Mapped[float | None] = mapped_column(Float, index=True)  # history, retention
    exit_code: Mapped[int | None] = mapped_column(Integer)
    stop_request: Mapped[str | None] = mapped_column(String(16))  # cancel | requeue
    run_count: Mapped[int] = mapped_column(Integer, default=0)
    # When it was last put back in the queue (a requeue, a retry; None: it has waited since
    # its submission), and what its runs before its latest one add up to: seconds pending
    # before them, seconds they ran, the lane time they were billed (and of it, what was
    # not charged to fair share) and the steps they counted (each its own count). Its
    # latest run's own figures are the columns above and below; gq history's totals are
    # the two summed.
    queued_time: Mapped[float | None] = mapped_column(Float)
    earlier_wait: Mapped[float] = mapped_column(Float, server_default="0")
    earlier_run: Mapped[float] = mapped_column(Float, server_default="0")
    earlier_attained: Mapped[float] = mapped_column(Float, server_default="0")
    earlier_steps: Mapped[int] = mapped_column(Integer, server_default="0")
    earlier_uncharged: Mapped[float] = mapped_column(Float, server_default="0")

    # Progress and measurements, flushed by the daemon about once a second.
    steps_done: Mapped[int] = mapped_column(Integer, default=0)
    attained: Mapped[float] = mapped_column(Float, default=0.0)
    # Of it, what its owner's fair share was not charged: side by side, the share of the
    # device it did not get (gq.exec.lane.packing.lane_share); 0 taking turns or alone.
    uncharged: Mapped[float] = mapped_column(Float, server_default="0")
    mean_iteration: Mapped[float | None] = mapped_column(Float)
    mean_gap: Mapped[float | None] = mapped_column(Float)  # idle seconds between iterations
    startup: Mapped[float | None] = mapped_column(Float)  # seconds from launch to 1st acquire
    mem_persistent: Mapped[int | None] = mapped_column(Integer)
    mem_peak: Mapped[int | None] = mapped_column(Integer)
    holds_lane: Mapped[bool] = mapped_column(Boolean, default=False)
    # How often its host took its lane inside an iteration (held past --max-hold while
    # another job waited), in its latest run.
    lane_taken: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    active_at: Mapped[float | None] = mapped_column(Float)  # an interactive job's last activity

    @property
    def args(self) -> list[str]:
        return list(self.payload.args)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.payload.env)

    @property
    def label(self) -> str:
        """Slurm's spelling: 17, or 17_3 for task 3 of array 17."""
        if self.array_job_id is None:
            return str(self.id)
        return f"{self.array_job_id}_{self.array_task_id}"


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time: Mapped[float] = mapped_column(Float)
    old_state: Mapped[str | None] = mapped_column(String(16))
    new_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)


class JobRun(Base):
    """One ended run of a job (written by the transition that ends it, as sacct keeps a
    requeued job's earlier runs): when it was queued, started and ended, how it ended
    (a terminal state, or REQUEUED with why), and what it did in it."""

    __tablename__ = "job_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    run: Mapped[int] = mapped_column(Integer)  # the job's run_count in it: 1, 2, ...
    queued_time: Mapped[float] = mapped_column(Float)  # submitted, or put back in the queue
    start_time: Mapped[float | None] = mapped_column(Float)
    end_time: Mapped[float] = mapped_column(Float)
    ended: Mapped[str] = mapped_column(String(16))  # COMPLETED, ..., or REQUEUED
    reason: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    device: Mapped[str | None] = mapped_column(String(64))
    steps_done: Mapped[int] = mapped_column(Integer)  # its own count
    steps_total: Mapped[int | None] = mapped_column(Integer)
    attained: Mapped[float] = mapped_column(Float)  # lane time billed


class Setting(Base):
    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON, nullable=True)

"""A requeued job's runs: each ended run kept (``job_runs``: when it was queued, started
and ended, how it ended, its steps and lane time), and on the job what its runs before the
latest add up to (``jobs.earlier_*``) and when it was last put back in the queue
(``jobs.queued_time``), so that gq history sums its runs as sacct does its steps. Jobs from
before have no earlier runs on record: their totals are their latest run's, as before.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_SUMS = (
    ("earlier_wait", sa.Float()),
    ("earlier_run", sa.Float()),
    ("earlier_attained", sa.Float()),
    ("earlier_steps", sa.Integer()),
)


def upgrade() -> None:
    # Added in place (no table rebuild), which keeps the jobs table's AUTOINCREMENT.
    op.add_column("jobs", sa.Column("queued_time", sa.Float(), nullable=True))
    for name, kind in _SUMS:
        op.add_column("jobs", sa.Column(name, kind, nullable=False, server_default="0"))
    op.create_table(
        "job_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("queued_time", sa.Float(), nullable=False),
        sa.Column("start_time", sa.Float(), nullable=True),
        sa.Column("end_time", sa.Float(), nullable=False),
        sa.Column("ended", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("device", sa.String(64), nullable=True),
        sa.Column("steps_done", sa.Integer(), nullable=False),
        sa.Column("steps_total", sa.Integer(), nullable=True),
        sa.Column("attained", sa.Float(), nullable=False),
    )
    op.create_index("ix_job_runs_job_id", "job_runs", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_runs_job_id", "job_runs")
    op.drop_table("job_runs")
    with op.batch_alter_table("jobs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        for name, _ in reversed(_SUMS):
            batch.drop_column(name)
        batch.drop_column("queued_time")

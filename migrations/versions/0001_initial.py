"""Initial schema: jobs, job events, settings.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("mem", sa.Integer),
        sa.Column("time_limit", sa.Integer),
        sa.Column("steps_total", sa.Integer),
        sa.Column("exclusive", sa.Boolean, nullable=False),
        sa.Column("requeue", sa.Boolean, nullable=False),
        sa.Column("script", sa.Text, nullable=False),
        sa.Column("spool_path", sa.Text, nullable=False),
        sa.Column("args", sa.JSON, nullable=False),
        sa.Column("interpreter", sa.Text),
        sa.Column("workdir", sa.Text, nullable=False),
        sa.Column("stdout_path", sa.Text, nullable=False),
        sa.Column("stderr_path", sa.Text, nullable=False),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("device", sa.String(64)),
        sa.Column("lane", sa.Integer),
        sa.Column("pid", sa.Integer),
        sa.Column("submit_time", sa.Float, nullable=False),
        sa.Column("start_time", sa.Float),
        sa.Column("end_time", sa.Float),
        sa.Column("exit_code", sa.Integer),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("run_count", sa.Integer, nullable=False),
        sa.Column("steps_done", sa.Integer, nullable=False),
        sa.Column("attained", sa.Float, nullable=False),
        sa.Column("mean_iteration", sa.Float),
        sa.Column("mem_persistent", sa.Integer),
        sa.Column("mem_peak", sa.Integer),
        sa.Column("holds_lane", sa.Boolean, nullable=False),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_user", "jobs", ["user"])
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("old_state", sa.String(16)),
        sa.Column("new_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_table(
        "settings", sa.Column("key", sa.String(64), primary_key=True), sa.Column("value", sa.JSON)
    )


def downgrade() -> None:
    op.drop_table("settings")
    op.drop_table("job_events")
    op.drop_table("jobs")

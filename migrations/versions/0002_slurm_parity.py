"""Slurm parity: job arrays, dependencies, holds; a stop request replaces the cancel flag.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("dependency", sa.Text))
        batch.add_column(sa.Column("held", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("array_job_id", sa.Integer))
        batch.add_column(sa.Column("array_task_id", sa.Integer))
        batch.add_column(sa.Column("array_max_running", sa.Integer))
        batch.add_column(sa.Column("stop_request", sa.String(16)))
        batch.create_index("ix_jobs_array_job_id", ["array_job_id"])
    op.execute("UPDATE jobs SET stop_request = 'cancel' WHERE cancel_requested")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cancel_requested")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false())
        )
    op.execute("UPDATE jobs SET cancel_requested = 1 WHERE stop_request = 'cancel'")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_array_job_id")
        for column in (
            "stop_request",
            "array_max_running",
            "array_task_id",
            "array_job_id",
            "held",
            "dependency",
        ):
            batch.drop_column(column)

"""The scheduler's device: each user's lane time, decayed with a half-life and kept across
jobs and restarts (``user_usage``: fair-share by user, as Slurm's fair-share keeps it), and
how often a job's host took its lane inside an iteration (``jobs.lane_taken``: it held it
past --max-hold while another job waited). Jobs from before count 0 times taken; no user has
used anything yet.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("lane_taken", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "user_usage",
        sa.Column("user", sa.String(64), primary_key=True),
        sa.Column("usage", sa.Float(), nullable=False),
        sa.Column("updated", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("user_usage")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("lane_taken")

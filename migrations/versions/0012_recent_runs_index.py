"""An index on (user, name, end time): a forecast estimates a job that gave no --steps from
its owner's recent jobs of the same name, read the last ended first, however many jobs of
other names or users the queue keeps.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_user_name_end", "jobs", ["user", "name", "end_time"])


def downgrade() -> None:
    op.drop_index("ix_jobs_user_name_end", "jobs")

"""An index on (user, end time): a user's finished jobs (gq history --user, gq status --all
--user) are read a page at a time, the last ended first, however many the queue keeps.

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_user_end", "jobs", ["user", "end_time"])


def downgrade() -> None:
    op.drop_index("ix_jobs_user_end", "jobs")

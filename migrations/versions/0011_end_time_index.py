"""An index on when jobs ended: a month of finished jobs is kept, and history (``--since``),
the oldest kept end and the retention purge read by it.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_end_time", "jobs", ["end_time"])


def downgrade() -> None:
    op.drop_index("ix_jobs_end_time", "jobs")

"""An index on when jobs ended: a month of finished jobs is kept, and history (the jobs that
ended last, a page at a time; ``--since``), the oldest kept end and the retention purge read
by it. Finished jobs from the first versions that have no end time get their start (else
their submission) as one, so that history lists them.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


_FINISHED = "('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'DEADLINE')"


def upgrade() -> None:
    op.execute(
        f"UPDATE jobs SET end_time = coalesce(start_time, submit_time) "
        f"WHERE end_time IS NULL AND state IN {_FINISHED}"
    )
    op.create_index("ix_jobs_end_time", "jobs", ["end_time"])


def downgrade() -> None:
    op.drop_index("ix_jobs_end_time", "jobs")

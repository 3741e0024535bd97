"""Whether a running job is preempted: suspended by the daemon, its device memory moved to
host memory for a higher-priority job (gq.daemon.preempting), as ``suspended`` is a user's
or an operator's suspend. Jobs from before were never preempted.

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

from gq.migrations import columns

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("preempted", sa.Boolean, nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    columns.drop("jobs", (("preempted", sa.Boolean),))

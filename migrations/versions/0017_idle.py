"""Interactive jobs' idle time: a job's last activity as its host saw it (its terminal's
use, a statement or cell computing, the lane), and the --idle-timeout after which it is
ended. Jobs from before keep NULL: no activity known (idle since their start), no timeout.

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa

from gq.migrations import columns

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None
_COLUMNS = (("idle_timeout", sa.Integer), ("active_at", sa.Float))


def upgrade() -> None:
    columns.add("jobs", _COLUMNS)


def downgrade() -> None:
    columns.drop("jobs", _COLUMNS)

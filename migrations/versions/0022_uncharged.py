"""What of a job's lane time its owner's fair share was not charged: side by side, the share
of the device it did not get (gq.exec.lane.packing.lane_share), for its latest run and its
earlier ones summed, so gq history can say how fast it ran side by side against alone.
Jobs from before were charged all their lane time.

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

from gq.migrations import columns

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

ADDED = (("uncharged", sa.Float), ("earlier_uncharged", sa.Float))


def upgrade() -> None:
    for name, kind in ADDED:
        op.add_column("jobs", sa.Column(name, kind, nullable=False, server_default="0"))


def downgrade() -> None:
    columns.drop("jobs", ADDED)

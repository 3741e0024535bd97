"""Each job's measured idle gap per iteration (release to next acquire), for gq history --csv.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("mean_gap", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("mean_gap")

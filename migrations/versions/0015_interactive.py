"""Interactive jobs (``gq run --pty``): a job that runs on a terminal its submitter holds.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # In place (SQLite's ALTER TABLE ADD COLUMN): every job from before is a batch job.
    op.add_column(
        "jobs", sa.Column("interactive", sa.Boolean(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("interactive")

"""Memory safety: where a job's device-memory declaration came from (as declared, measured
by its probe, raised after it ran out of memory), what it does at an out-of-memory
(``--oom requeue|fail``), and how many of its runs ended so.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Added in place (SQLite's ALTER TABLE ADD COLUMN): a queue of 100,000 finished jobs is
    # not copied for three columns.
    op.add_column("jobs", sa.Column("mem_basis", sa.String(16), nullable=True))
    op.add_column("jobs", sa.Column("on_oom", sa.String(16), nullable=True))
    op.add_column("jobs", sa.Column("ooms", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("ooms")
        batch.drop_column("on_oom")
        batch.drop_column("mem_basis")

"""What runs when a job changes state (``notify``: its ``--notify`` command; ``mail_type``,
``mail_user``: sbatch's mail options), and whether an operator or its owner suspended it
(``suspended``: a RUNNING job stopped in place, as ``scontrol suspend``).

Jobs from before keep NULL (no hook, no mail) and are not suspended.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

from gq.migrations import columns

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None
_COLUMNS = (("notify", sa.Text), ("mail_type", sa.String(64)), ("mail_user", sa.Text))


def upgrade() -> None:
    columns.add("jobs", _COLUMNS)
    op.add_column(
        "jobs", sa.Column("suspended", sa.Boolean, nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    columns.drop("jobs", (*_COLUMNS, ("suspended", sa.Boolean)))

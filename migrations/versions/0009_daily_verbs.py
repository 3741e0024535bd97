"""What a job asked for of gq's daily verbs: the devices it is pinned to (``nodelist``,
``-w gpu0,gpu2``), how often a failed run is run again (``retries``, and ``retries_left``,
counted again from a ``gq requeue``; ``retry_delay`` seconds before each), and how many
tasks its ``srun`` starts (``ntasks``, sbatch's ``-n``).

Jobs from before keep NULL in each: any device, no retry, one task.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa

from gq.migrations import columns

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None
_COLUMNS = (
    ("nodelist", sa.Text),
    ("retries", sa.Integer),
    ("retries_left", sa.Integer),
    ("retry_delay", sa.Float),
    ("ntasks", sa.Integer),
)


def upgrade() -> None:
    columns.add("jobs", _COLUMNS)


def downgrade() -> None:
    columns.drop("jobs", _COLUMNS)

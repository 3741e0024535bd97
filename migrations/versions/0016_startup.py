"""Each run's start-up: seconds from its launch to its first acquire (interpreter, imports,
set-up), as its host measured it; forecasts add what a user's jobs of a name took. Jobs
from before keep NULL: their forecasts go on their overheads, as before.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa

from gq.migrations import columns

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None
_COLUMNS = (("startup", sa.Float),)


def upgrade() -> None:
    columns.add("jobs", _COLUMNS)


def downgrade() -> None:
    columns.drop("jobs", _COLUMNS)

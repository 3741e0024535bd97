"""The command line a submission was given, as the user typed it and a shell reads it
(``payloads.command``: gq run -- CMD ARGS, --wrap's, SCRIPT ARGS), which gq show gives as
the job's Command. Submissions from before have none: gq show quotes their script and
arguments instead.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

from gq.migrations import columns

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_COLUMNS = (("command", sa.Text()),)


def upgrade() -> None:
    columns.add("payloads", _COLUMNS)


def downgrade() -> None:
    with op.batch_alter_table("payloads") as batch:
        batch.drop_column("command")

"""Each submission records the size of its script snapshot (``payloads.script_bytes``), so
that the spool a user's jobs keep can be bounded (the daemon's ``--max-spool``).

Submissions from before are measured from their snapshots on disk, where still there.

Revision ID: 0007
Revises: 0006
"""

import os

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("payloads") as batch:
        batch.add_column(sa.Column("script_bytes", sa.Integer, nullable=False,
                                   server_default="0"))
    connection = op.get_bind()
    rows = connection.execute(sa.text(
        "SELECT payload_id, min(spool_path) FROM jobs WHERE spool_path != '' "
        "GROUP BY payload_id")).fetchall()
    for payload_id, path in rows:
        try:
            size = os.lstat(path).st_size
        except OSError:
            continue
        connection.execute(sa.text("UPDATE payloads SET script_bytes = :size WHERE id = :id"),
                           {"size": size, "id": payload_id})


def downgrade() -> None:
    with op.batch_alter_table("payloads") as batch:
        batch.drop_column("script_bytes")

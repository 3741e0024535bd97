"""Each submission records what its script snapshot costs the spool
(``payloads.spool_bytes``: its blocks and two inodes' worth), so that the spool a user's
jobs keep can be bounded (the daemon's ``--max-spool``); ``spool_usage`` keeps each
user's sum, so that a submit reads one row.

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
_BLOCK = 4096


def upgrade() -> None:
    with op.batch_alter_table("payloads") as batch:
        batch.add_column(sa.Column("spool_bytes", sa.Integer, nullable=False, server_default="0"))
    op.create_index("ix_jobs_uid_payload", "jobs", ["uid", "payload_id"])
    op.create_table(
        "spool_usage",
        sa.Column("uid", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("bytes", sa.Integer, nullable=False),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.text(
            "SELECT payload_id, min(spool_path) FROM jobs WHERE spool_path != '' "
            "GROUP BY payload_id"
        )
    ).fetchall()
    for payload_id, path in rows:
        try:
            size = os.lstat(path).st_size
        except OSError:
            continue
        size = -(-size // _BLOCK) * _BLOCK + 2 * _BLOCK  # as gq.queue.spool.footprint
        connection.execute(
            sa.text("UPDATE payloads SET spool_bytes = :size WHERE id = :id"),
            {"size": size, "id": payload_id},
        )
    connection.execute(
        sa.text(
            "INSERT INTO spool_usage (uid, bytes) SELECT owners.uid, sum(payloads.spool_bytes) "
            "FROM (SELECT DISTINCT payload_id, uid FROM jobs WHERE uid IS NOT NULL) AS owners "
            "JOIN payloads ON payloads.id = owners.payload_id GROUP BY owners.uid"
        )
    )


def downgrade() -> None:
    op.drop_table("spool_usage")
    op.drop_index("ix_jobs_uid_payload", "jobs")
    with op.batch_alter_table("payloads") as batch:
        batch.drop_column("spool_bytes")

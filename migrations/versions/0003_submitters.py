"""Jobs run as their submitters: each job records the submitter's uid, gid and umask.

Rows from before this revision were submitted to a personal daemon by the user named in
``user``: their uid and gid are looked up by that name (left empty for a name this machine
does not know), and their umask is taken as the usual 022.

Revision ID: 0003
Revises: 0002
"""

import pwd

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("uid", sa.Integer))
        batch.add_column(sa.Column("gid", sa.Integer))
        batch.add_column(sa.Column("umask", sa.Integer, nullable=False, server_default="18"))
    connection = op.get_bind()
    users = [row[0] for row in connection.execute(sa.text("SELECT DISTINCT user FROM jobs"))]
    for name in users:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        connection.execute(
            sa.text("UPDATE jobs SET uid = :uid, gid = :gid WHERE user = :name"),
            {"uid": entry.pw_uid, "gid": entry.pw_gid, "name": name},
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for column in ("umask", "gid", "uid"):
            batch.drop_column(column)

"""A job's environment and arguments live in ``payloads``, once per submission (an array's
tasks share one); an index serves the per-user pending count; job ids are never given twice
(AUTOINCREMENT: finished jobs are purged now); and values that no valid gq writes are
cleared, so that no row can break a query for anyone.

Earlier daemons stored whatever a worker or a client sent: a string where a number
belongs (``mem_persistent = 'abc'``), a deadline past the year 9999, an infinite float, a
NUL in a name. Each such value becomes empty (NULL) or its column's neutral value.

Revision ID: 0006
Revises: 0005
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

MAX_TIMESTAMP = 253402300799.0
_INTEGERS = {
    "mem": None,
    "time_limit": None,
    "steps_total": None,
    "exit_code": None,
    "pid": None,
    "lane": None,
    "mem_persistent": None,
    "mem_peak": None,
    "array_job_id": None,
    "array_task_id": None,
    "array_max_running": None,
    "steps_done": 0,
    "run_count": 0,
    "priority": 0,
    "gpus": 1,
    "uid": None,
    "gid": None,
    "umask": 18,
}
_REALS = {
    "mean_iteration": None,
    "mean_gap": None,
    "attained": 0.0,
    "start_time": None,
    "end_time": None,
    "deadline": None,
}
_TEXTS = (
    "name",
    "user",
    "reason",
    "dependency",
    "workdir",
    "stdout_path",
    "stderr_path",
    "script",
    "interpreter",
    "device",
)


def upgrade() -> None:
    op.create_table(
        "payloads",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("args", sa.JSON, nullable=False),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("payload_id", sa.Integer))
    connection = op.get_bind()
    first_of_array: dict[int, int] = {}
    rows = connection.execute(sa.text("SELECT id, array_job_id, env, args FROM jobs ORDER BY id"))
    for job_id, array_id, env, args in rows.fetchall():
        if array_id is not None and array_id in first_of_array:
            payload = first_of_array[array_id]
        else:
            payload = connection.execute(
                sa.text("INSERT INTO payloads (env, args) VALUES (:env, :args)"),
                {"env": _json(env, {}), "args": _json(args, [])},
            ).lastrowid
            if array_id is not None:
                first_of_array[array_id] = payload
        connection.execute(
            sa.text("UPDATE jobs SET payload_id = :p WHERE id = :id"), {"p": payload, "id": job_id}
        )
    # AUTOINCREMENT: an id is never given twice, even once the jobs that had it are purged.
    with op.batch_alter_table(
        "jobs", recreate="always", table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        batch.drop_column("env")
        batch.drop_column("args")
        batch.alter_column("payload_id", existing_type=sa.Integer, nullable=False)
        batch.create_foreign_key("fk_jobs_payload", "payloads", ["payload_id"], ["id"])
        batch.create_index("ix_jobs_payload_id", ["payload_id"])
        batch.create_index("ix_jobs_user_state", ["user", "state"])
    for column, neutral in _INTEGERS.items():
        connection.execute(
            sa.text(
                f"UPDATE jobs SET {column} = :neutral "
                f"WHERE typeof({column}) NOT IN ('integer', 'null')"
            ),
            {"neutral": neutral},
        )
    for column, neutral in _REALS.items():
        connection.execute(
            sa.text(
                f"UPDATE jobs SET {column} = :neutral WHERE typeof({column}) NOT IN "
                f"('integer', 'real', 'null') OR abs({column}) > :limit"
            ),
            {"neutral": neutral, "limit": MAX_TIMESTAMP},
        )
    # SQLite's own string functions stop at a NUL: the text columns are mended here.
    texts = ", ".join(_TEXTS)
    for row in connection.execute(sa.text(f"SELECT id, {texts} FROM jobs")).fetchall():
        mended = {
            c: v.replace("\0", "?")
            for c, v in zip(_TEXTS, row[1:])
            if isinstance(v, str) and "\0" in v
        }
        if mended:
            assignments = ", ".join(f"{c} = :{c}" for c in mended)
            connection.execute(
                sa.text(f"UPDATE jobs SET {assignments} WHERE id = :id"), {**mended, "id": row[0]}
            )


def _json(text, empty) -> str:
    """A JSON column's text, or the empty value where an old row holds something else."""
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        value = None
    return json.dumps(value if isinstance(value, type(empty)) else empty)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("env", sa.JSON, nullable=False, server_default="{}"))
        batch.add_column(sa.Column("args", sa.JSON, nullable=False, server_default="[]"))
    op.execute(
        "UPDATE jobs SET env = (SELECT env FROM payloads WHERE payloads.id = "
        "jobs.payload_id), args = (SELECT args FROM payloads WHERE payloads.id = "
        "jobs.payload_id)"
    )
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_user_state")
        batch.drop_index("ix_jobs_payload_id")
        batch.drop_constraint("fk_jobs_payload", type_="foreignkey")
        batch.drop_column("payload_id")
    op.drop_table("payloads")

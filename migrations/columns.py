"""What revisions that only add nullable columns share (their data needs no moving).

Columns are added in place (SQLite's ALTER TABLE ADD COLUMN): a batch operation would
rebuild the table and lose its AUTOINCREMENT, which keeps job ids from ever being given
twice."""

import sqlalchemy as sa
from alembic import op


def add(table: str, columns: tuple[tuple[str, type], ...]) -> None:
    for name, kind in columns:
        op.add_column(table, sa.Column(name, kind, nullable=True))


def drop(table: str, columns: tuple[tuple[str, type], ...]) -> None:
    with op.batch_alter_table(table, table_kwargs={"sqlite_autoincrement": True}) as batch:
        for name, _ in reversed(columns):
            batch.drop_column(name)

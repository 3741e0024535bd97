"""Alembic environment: runs gq's revisions against the queue database."""

from alembic import context
from sqlalchemy import create_engine

from gq.queue.models import Base

config = context.config


def run_migrations() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=True,  # SQLite needs table rebuilds for most ALTERs
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    engine.dispose()


run_migrations()

"""The job queue: SQLite models, the engine, state transitions and the script spool."""

"""Statements on a job's path, compiled once and run on SQLite's own connection.

Every job passes through a dozen statements (its submit, its start, its pid, its end, the
scheduling pass's reads). SQLAlchemy spends tens of microseconds around each one (building
its execution context, processing its parameters and rows); SQLite runs them in a few. A
:class:`Prepared` statement is compiled once by SQLAlchemy (so it is written, and typed, as
any other), then run directly on the SQLite connection of the caller's transaction
(:class:`gq.queue.engine.Transaction`), with the type conversions (JSON, booleans) of the
same type objects. What it cannot do exactly as SQLAlchemy would (an INSERT that leaves a
Python-side column default to fill in) it refuses when it is first used.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Insert, Update
from sqlalchemy.dialects import sqlite

if TYPE_CHECKING:
    from gq.queue.engine import Transaction

_DIALECT = sqlite.dialect()

Convert = Callable[[Any], Any] | None


@dataclass(frozen=True)
class _Form:
    """One compiled shape of a statement: its SQL, where each ``?`` takes its value from
    (a parameter's name, or a constant of the statement), and how to convert the values
    going in and the columns coming out."""

    sql: str
    names: tuple[str | None, ...]  # parameter name per position; None: take the constant
    constants: tuple[Any, ...]
    converters: tuple[Convert, ...]
    results: tuple[tuple[int, Callable[[Any], Any]], ...]  # column index, its conversion


class Prepared:
    """A Core statement run on the SQLite connection of a transaction. An
    ``IN`` list bound with ``bindparam(name, expanding=True)`` is passed as one JSON array
    (``IN (SELECT value FROM json_each(?))``), so that its SQL, and SQLite's prepared
    statement, stay the same whatever the list's length."""

    def __init__(self, statement: Any):
        self.statement = statement
        self._forms: dict[tuple[str, ...], _Form] = {}

    def execute(
        self, transaction: Transaction, params: Mapping[str, Any] | None = None
    ) -> sqlite3.Cursor:
        params = params or {}
        form = self._form(params)
        return transaction.sqlite.execute(form.sql, _bound(form, params))

    def executemany(self, transaction: Transaction, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            form = self._form(rows[0])
            transaction.sqlite.executemany(form.sql, [_bound(form, row) for row in rows])

    def rows(
        self, transaction: Transaction, params: Mapping[str, Any] | None = None
    ) -> list[Sequence[Any]]:
        """The rows read, each column converted as SQLAlchemy would."""
        params = params or {}
        form = self._form(params)
        found = transaction.sqlite.execute(form.sql, _bound(form, params)).fetchall()
        if not form.results:
            return found
        converted: list[Sequence[Any]] = []
        for row in found:
            values = list(row)
            for index, convert in form.results:
                values[index] = convert(values[index])
            converted.append(values)
        return converted

    def scalar(self, transaction: Transaction, params: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row (None: no row)."""
        found = self.rows(transaction, params)
        return found[0][0] if found else None

    def _form(self, params: Mapping[str, Any]) -> _Form:
        # An INSERT's (or UPDATE's) columns are those its parameters name, as SQLAlchemy
        # compiles it.
        keys = tuple(sorted(params)) if isinstance(self.statement, (Insert, Update)) else ()
        form = self._forms.get(keys)
        if form is None:
            form = self._forms[keys] = _compile(self.statement, keys)
        return form


def _compile(statement: Any, keys: tuple[str, ...]) -> _Form:
    compiled = statement.compile(dialect=_DIALECT, column_keys=list(keys) or None)
    missing = sorted(
        column.key for column in [*compiled.insert_prefetch, *compiled.update_prefetch]
    )
    if missing:
        raise TypeError(f"a prepared statement needs every column with a default: {missing}")
    sql = compiled.string
    names: list[str | None] = []
    constants: list[Any] = []
    converters: list[Convert] = []
    for name in compiled.positiontup:
        bind = compiled.binds[name]
        if bind.expanding:
            sql = sql.replace(f"(__[POSTCOMPILE_{name}])", "(SELECT value FROM json_each(?))")
            converters.append(json.dumps)
        else:
            converters.append(bind.type.bind_processor(_DIALECT))
        given = name in keys or bind.required or bind.expanding
        names.append(name if given else None)  # else a value written into the statement
        constants.append(None if given else bind.effective_value)
    processors = (
        column.type.result_processor(_DIALECT, None) for column in statement.exported_columns
    )  # a SELECT's, or RETURNING's
    results = tuple(
        (index, convert) for index, convert in enumerate(processors) if convert is not None
    )
    return _Form(sql, tuple(names), tuple(constants), tuple(converters), results)


def _bound(form: _Form, params: Mapping[str, Any]) -> tuple:
    values = []
    for name, constant, convert in zip(form.names, form.constants, form.converters):
        value = constant if name is None else params[name]
        values.append(value if convert is None else convert(value))
    return tuple(values)

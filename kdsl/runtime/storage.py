"""The one SQLite layer under every kdsl store (search results, evaluations, tuning records).

Every store opens its file through :class:`Database`, so they all behave alike: write mode uses
WAL journaling (readers never block the writer), a 30 s busy timeout, autocommit outside explicit
transactions, and :meth:`Database.write` for a transaction taken with ``BEGIN IMMEDIATE`` (the
write lock is held from the first read, so read-then-write cannot race another process);
read-only mode opens ``file:...?mode=ro``, so reading a database never changes its file. SQLite's
own errors become the store's ``KdslError`` subclass with the file named, and
:func:`json_object` decodes a JSON column with a message that names the row and column.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "x.db")
>>> db = Database(path, schema="CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v TEXT)")
>>> with db.write() as connection:
...     _ = connection.execute("INSERT INTO t VALUES ('a', '{}')")
>>> db.rows("SELECT k, v FROM t")
[('a', '{}')]
>>> db.close()
>>> Database(path, readonly=True).rows("SELECT count(*) FROM t")
[(1,)]
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kdsl.lang.errors import KdslError, printable

__all__ = ["BUSY_TIMEOUT", "Database", "json_object"]

#: Seconds a statement waits for another process's write lock before failing.
BUSY_TIMEOUT = 30.0


class Database:
    """An SQLite file opened for one store. ``error`` is the store's ``KdslError`` subclass;
    ``what`` says what the file is for in messages (``"results database"``)."""

    def __init__(
        self,
        path: str | Path,
        *,
        schema: str | None = None,
        readonly: bool = False,
        what: str = "database",
        error: type[KdslError] = KdslError,
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.what = what
        self.error = error
        if self.path.is_dir():
            raise error(f"the {what} {printable(self.path)!r} is a folder; give a file path like results.db")
        if readonly and not self.path.is_file():
            raise error(f"no {what} at {printable(self.path)!r}")
        if not readonly and not self.path.parent.is_dir():
            raise error(
                f"cannot create the {what} {printable(self.path)!r}: "
                f"the folder {printable(self.path.parent)!r} does not exist"
            )
        try:
            if readonly:
                # mode=ro: SQLite itself refuses every write, so reading cannot change the file
                uri = "file:" + quote(str(self.path.resolve())) + "?mode=ro"
                self.connection = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT)
            else:
                # autocommit: transactions are explicit (write()), so none is left open by accident
                self.connection = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT, isolation_level=None)
                self.connection.execute("PRAGMA journal_mode=WAL")
                self.connection.execute("PRAGMA synchronous=NORMAL")
                if schema:
                    self.connection.executescript(schema)
        except sqlite3.DatabaseError as failure:
            self.close()
            raise error(f"cannot use {printable(self.path)!r} as a {what}: {failure}") from None

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``): committed when the block ends, rolled back
        when it raises."""
        if self.readonly:
            raise self.error(f"the {self.what} {printable(self.path)!r} was opened read-only")
        try:
            self.connection.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as failure:
            raise self.error(f"cannot write to the {self.what} {printable(self.path)!r}: {failure}") from None
        try:
            yield self.connection
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    def rows(self, query: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of a read query; a database error names the file."""
        try:
            return self.connection.execute(query, tuple(args)).fetchall()
        except sqlite3.DatabaseError as failure:
            raise self.error(f"cannot read the {self.what} {printable(self.path)!r}: {failure}") from None

    def columns(self, table: str) -> set[str]:
        """The column names of ``table`` (empty if it does not exist)."""
        return {row[1] for row in self.rows(f"PRAGMA table_info({table})")}

    def close(self) -> None:
        connection = getattr(self, "connection", None)
        if connection is not None:
            connection.close()
            self.connection = None  # type: ignore[assignment]


def json_object(text: object, where: str, error: type[KdslError] = KdslError) -> dict[str, Any]:
    """A JSON column's object; anything else raises ``error`` naming ``where`` (file, table, row, column).

    >>> json_object('{"a": 1}', "t row 'k': the column m")
    {'a': 1}
    """
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise error(
            f"{where} holds {printable(repr(text)[:60])}, not a JSON object; delete the row or use another database"
        )
    return value

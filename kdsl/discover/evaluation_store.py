"""The tables discover keeps beside search's store: ``evaluations`` (each trained candidate's and
the baseline's metrics) and ``screens`` (pre-screening scores).

They live in the run's SQLite file next to search's ``candidates`` table, which only
:class:`kdsl.search.store.Store` reads: what a candidate is and which strategy found it come from
the store's API, so its schema is known in one package.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "runs.sqlite")
>>> evaluations = Evaluations(path)
>>> evaluations.add({"key": "k1", "status": "ok", "metrics": {"accuracy": 0.9}})
>>> evaluations.add_screen("k2", 0.5, {})
>>> sorted(evaluations.done()), evaluations.screened(), evaluations.screened(among={"k3"})
(['k1'], {'k2': 0.5}, {})
>>> evaluations.close()
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from typing import Any

from kdsl.lang.errors import SearchError, printable
from kdsl.runtime.storage import Database, json_object

__all__ = ["Evaluations"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS evaluations (
    key TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    status TEXT NOT NULL,
    metrics TEXT NOT NULL,
    error TEXT,
    seconds REAL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS screens (
    key TEXT PRIMARY KEY,
    score REAL,
    metrics TEXT NOT NULL,
    created REAL NOT NULL
);
"""


class Evaluations:
    """The ``evaluations`` and ``screens`` tables of the results database at ``path`` (same SQLite
    file as the search store, WAL mode); ``readonly=True`` opens an existing file without writing,
    and :attr:`present` says whether discover ever wrote to it."""

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        self.path = path
        self.database = Database(
            path, schema=None if readonly else _SCHEMA, readonly=readonly, what="results database", error=SearchError
        )
        self.present = bool(self.database.columns("evaluations"))
        self._screens = bool(self.database.columns("screens"))

    def done(self) -> set[str]:
        """The keys with an evaluation (the baseline's too)."""
        if not self.present:
            return set()
        return {row[0] for row in self.database.rows("SELECT key FROM evaluations")}

    def add(self, result: Mapping[str, Any], role: str = "candidate") -> None:
        with self.database.write() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    result["key"],
                    role,
                    result["status"],
                    json.dumps(result.get("metrics") or {}),
                    result.get("error"),
                    result.get("seconds"),
                    time.time(),
                ),
            )

    def screened(self, among: Collection[str] | None = None) -> dict[str, float | None]:
        """Pre-screening scores by candidate key (None where screening failed); only of the keys
        ``among``, when given (e.g. the candidates one strategy found, from the search store)."""
        if not self._screens:
            return {}
        found = {key: score for key, score in self.database.rows("SELECT key, score FROM screens")}
        return found if among is None else {key: score for key, score in found.items() if key in among}

    def add_screen(self, key: str, score: float | None, metrics: Mapping[str, Any]) -> None:
        with self.database.write() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO screens VALUES (?, ?, ?, ?)",
                (key, score, json.dumps(dict(metrics)), time.time()),
            )

    def rows(self, role: str | None = None) -> list[dict[str, Any]]:
        """Every evaluation (of ``role`` only, when given) as a dict, its metrics parsed."""
        if not self.present:
            return []
        query = "SELECT key, role, status, metrics, error, seconds FROM evaluations"
        cursor = self.database.rows(query + (" WHERE role = ?" if role else ""), (role,) if role else ())
        return [
            {"key": k, "role": r, "status": s, "metrics": self._metrics(k, m), "error": e, "seconds": sec}
            for k, r, s, m, e, sec in cursor
        ]

    def _metrics(self, key: object, text: object) -> dict[str, Any]:
        where = f"{printable(self.path)}: evaluations row {printable(repr(key)[:80])}: the column metrics"
        return json_object(text, where, SearchError)

    def close(self) -> None:
        self.database.close()

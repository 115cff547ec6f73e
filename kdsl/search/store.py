"""The results store: one SQLite database (WAL mode), one row per distinct candidate.

``candidates`` holds each operator once, keyed by its canonical hash ``op.key``: DSL text, depth,
per-layer FLOPs and parameters, the strategy and seed that found it, status, metrics (JSON) and
timestamps. ``runs`` holds each search (identified by its space fingerprint, strategy and seed)
with its progress: the enumeration cursor, or the iteration counter of random sampling and MCTS.
Results and progress are written in one transaction, so a search killed at any point resumes
from its last commit without losing or repeating results.

>>> import tempfile, os
>>> store = Store(os.path.join(tempfile.mkdtemp(), "r.db"))
>>> run, progress = store.open_run("fingerprint", "enumerate", 0, "demo")
>>> progress
{}
>>> row = {"key": "k1", "dsl": "...", "depth": 2, "status": "valid", "flops": 10, "params": 3}
>>> store.commit(run, [row], {"cursor": [0]})
>>> store.known("k1"), store.open_run("fingerprint", "enumerate", 0, "demo")[1]
(True, {'cursor': [0]})
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kdsl.search.errors import SearchError

__all__ = ["Store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    strategy TEXT NOT NULL,
    seed INTEGER NOT NULL,
    description TEXT,
    progress TEXT NOT NULL DEFAULT '{}',
    finished INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    UNIQUE (fingerprint, strategy, seed)
);
CREATE TABLE IF NOT EXISTS candidates (
    key TEXT PRIMARY KEY,
    dsl TEXT NOT NULL,
    depth INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    flops INTEGER,
    params INTEGER,
    flops_per_layer TEXT,
    params_per_layer TEXT,
    reward REAL,
    strategy TEXT,
    seed INTEGER,
    run INTEGER REFERENCES runs(id),
    metrics TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS candidates_by_reward ON candidates (status, reward DESC);
"""


class Store:
    """A results database at ``path`` (created if missing; its folder must exist)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_dir():
            raise SearchError(f"the results database {str(path)!r} is a folder; give a file path like results.db")
        if not path.parent.is_dir():
            raise SearchError(
                f"cannot create the results database {str(path)!r}: the folder {str(path.parent)!r} does not exist"
            )
        try:
            self.connection = sqlite3.connect(str(path), timeout=30)
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=NORMAL")
            self.connection.executescript(_SCHEMA)
        except sqlite3.DatabaseError as error:
            raise SearchError(f"cannot use {str(path)!r} as a results database: {error}") from None
        self.path = path

    def close(self) -> None:
        self.connection.close()

    def open_run(self, fingerprint: str, strategy: str, seed: int, description: str) -> tuple[int, dict[str, Any]]:
        """The run for (space, strategy, seed), created if new, and its saved progress."""
        now = time.time()
        with self.connection:
            self.connection.execute(
                "INSERT OR IGNORE INTO runs (fingerprint, strategy, seed, description, created, updated) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (fingerprint, strategy, seed, description, now, now),
            )
        row = self.connection.execute(
            "SELECT id, progress FROM runs WHERE fingerprint = ? AND strategy = ? AND seed = ?",
            (fingerprint, strategy, seed),
        ).fetchone()
        return int(row[0]), json.loads(row[1])

    def finished(self, run: int) -> bool:
        row = self.connection.execute("SELECT finished FROM runs WHERE id = ?", (run,)).fetchone()
        return bool(row and row[0])

    def known(self, key: str) -> bool:
        return self.connection.execute("SELECT 1 FROM candidates WHERE key = ?", (key,)).fetchone() is not None

    def get(self, key: str) -> dict[str, Any] | None:
        cursor = self.connection.execute("SELECT * FROM candidates WHERE key = ?", (key,))
        row = cursor.fetchone()
        return _row(cursor, row) if row else None

    def commit(
        self, run: int, rows: Iterable[Mapping[str, Any]], progress: Mapping[str, Any], *, finished: bool = False
    ) -> None:
        """Insert new candidates (a known key is left as it is) and save the run's progress, atomically."""
        now = time.time()
        with self.connection:
            for row in rows:
                self.connection.execute(
                    "INSERT OR IGNORE INTO candidates (key, dsl, depth, status, error, flops, params, flops_per_layer, "
                    "params_per_layer, reward, strategy, seed, run, metrics, created, updated) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        row["key"],
                        row["dsl"],
                        row["depth"],
                        row["status"],
                        row.get("error"),
                        row.get("flops"),
                        row.get("params"),
                        json.dumps(row.get("flops_per_layer")),
                        json.dumps(row.get("params_per_layer")),
                        row.get("reward"),
                        row.get("strategy"),
                        row.get("seed"),
                        run,
                        json.dumps(row.get("metrics", {}), sort_keys=True),
                        now,
                        now,
                    ),
                )
            self.connection.execute(
                "UPDATE runs SET progress = ?, finished = ?, updated = ? WHERE id = ?",
                (json.dumps(progress, sort_keys=True), int(finished), now, run),
            )

    def top(self, k: int = 10, status: str | None = "valid") -> list[dict[str, Any]]:
        """The best ``k`` candidates by reward (then fewest FLOPs)."""
        where = "WHERE status = ?" if status else ""
        args: tuple = (status,) if status else ()
        cursor = self.connection.execute(
            f"SELECT * FROM candidates {where} ORDER BY reward DESC, flops ASC, key ASC LIMIT ?", (*args, int(k))
        )
        return [_row(cursor, row) for row in cursor.fetchall()]

    def counts(self) -> dict[str, int]:
        """How many candidates have each status."""
        return dict(self.connection.execute("SELECT status, COUNT(*) FROM candidates GROUP BY status").fetchall())

    def runs(self) -> list[dict[str, Any]]:
        cursor = self.connection.execute(
            "SELECT id, strategy, seed, description, progress, finished FROM runs ORDER BY id"
        )
        return [_row(cursor, row) for row in cursor.fetchall()]


def _row(cursor: sqlite3.Cursor, row: tuple) -> dict[str, Any]:
    item = {description[0]: value for description, value in zip(cursor.description, row)}
    for key in ("flops_per_layer", "params_per_layer", "metrics", "progress"):
        if key in item and isinstance(item[key], str):
            item[key] = json.loads(item[key])
    return item

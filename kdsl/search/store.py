"""The results store: one SQLite database (WAL mode), one row per distinct candidate.

``candidates`` holds each operator once, keyed by its canonical hash ``op.key``: DSL text, depth,
per-layer FLOPs and parameters, the strategy and seed that found it, status, metrics (JSON),
timestamps, and the fingerprint of its function family (``semantic``, :mod:`kdsl.search.semantic`).
A valid candidate whose family is already stored gets the status ``duplicate`` (and
``metrics["duplicate_of"]``): kept, so that no run evaluates it again, but not a result. ``runs``
holds each search (identified by its space fingerprint, strategy and seed) with its progress: the
enumeration cursor, or the iteration counter of random sampling and MCTS. Results and progress are
written in one transaction, so a search killed at any point resumes from its last commit without
losing or repeating results.

**One writer per run.** A search *claims* its run (:meth:`Store.claim`) before it starts: the run's
row records the holder (process id and host), a heartbeat, and a lease number that grows with
every claim. A second process that asks for a run whose holder is alive is refused with a
:class:`SearchError` naming the holder, so two ``kdsl search`` commands on one database never do
the same work twice nor overwrite each other's progress. A holder that died (``kill -9``, a power
cut) does not block: on its own host a dead process id frees the lease at once, elsewhere a
heartbeat older than :data:`STALE_AFTER` seconds does. Every write is *fenced*: it checks, in the
same transaction, that the writer's lease number is still the run's, so a stalled writer whose
lease was taken over cannot overwrite the new holder's progress (its unsaved results are found
again by the new holder, which resumes from the last committed progress).

:class:`Store` opened with ``readonly=True`` (``kdsl results``) never writes: no journal-mode
change, no schema, no lease. Rows that do not have the types kdsl writes (text in ``flops``, bad
JSON in ``metrics``) raise a :class:`SearchError` that names the row and the column.

>>> import tempfile, os
>>> store = Store(os.path.join(tempfile.mkdtemp(), "r.db"))
>>> lease = store.claim("fingerprint", "enumerate", 0, "demo")
>>> lease.progress
{}
>>> row = {"key": "k1", "dsl": "...", "depth": 2, "status": "valid", "flops": 10, "params": 3}
>>> store.commit(lease, [row], {"cursor": [0]}, release=True)
>>> store.known("k1"), store.claim("fingerprint", "enumerate", 0, "demo").progress
(True, {'cursor': [0]})
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdsl.lang.errors import SearchError, printable
from kdsl.lang.parser import parse
from kdsl.runtime.storage import Database

__all__ = ["HEARTBEAT_EVERY", "STALE_AFTER", "Lease", "Store", "candidate"]

#: Seconds without a heartbeat after which a run's holder on another host counts as gone (on this
#: host kdsl asks the process table instead).
STALE_AFTER = 60.0
#: Seconds between a lease's heartbeats.
HEARTBEAT_EVERY = 5.0

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
    holder TEXT,
    lease INTEGER NOT NULL DEFAULT 0,
    heartbeat REAL,
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

#: The lease columns, added to databases written before leases existed.
_LEASE_COLUMNS = {"holder": "TEXT", "lease": "INTEGER NOT NULL DEFAULT 0", "heartbeat": "REAL"}

#: Candidate columns added since the first schema (older databases get them on opening for writing):
#: ``semantic`` is the hash of the function family's equality pattern and ``semantic_rank`` its
#: dimension where known (:mod:`kdsl.search.semantic`).
_CANDIDATE_COLUMNS = {"semantic": "TEXT", "semantic_rank": "INTEGER"}

#: Columns that queries name (WHERE / ORDER BY) or that ``kdsl results`` prints: without them the
#: file is not a results database kdsl can read.
_REQUIRED = ("key", "dsl", "depth", "status", "flops", "params", "reward")

#: The type each column must hold when present; None is allowed where the schema allows NULL.
_TYPES: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "key": ((str,), False, "text"),
    "dsl": ((str,), False, "text"),
    "depth": ((int,), False, "an integer"),
    "status": ((str,), False, "text"),
    "error": ((str,), True, "text"),
    "flops": ((int,), True, "an integer"),
    "params": ((int,), True, "an integer"),
    "reward": ((int, float), True, "a number"),
    "strategy": ((str,), True, "text"),
    "seed": ((int,), True, "an integer"),
    "description": ((str,), True, "text"),
    "semantic": ((str,), True, "text"),
    "semantic_rank": ((int,), True, "an integer"),
}
_JSON_COLUMNS = ("flops_per_layer", "params_per_layer", "metrics", "progress")


@dataclass
class Lease:
    """This process's claim on one run: the run's id, the lease number that fences its writes,
    and the progress saved by the run's last commit. While held, a background thread renews the
    run's heartbeat every :data:`HEARTBEAT_EVERY` seconds, however long one step takes."""

    run: int
    number: int
    progress: dict[str, Any] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def _start(self, path: Path) -> None:
        self._thread = threading.Thread(target=self._beat, args=(path,), name="kdsl-lease", daemon=True)
        self._thread.start()

    def _beat(self, path: Path) -> None:
        connection = sqlite3.connect(str(path), timeout=30)
        try:
            while not self._stop.wait(HEARTBEAT_EVERY):
                try:
                    with connection:
                        connection.execute(
                            "UPDATE runs SET heartbeat = ? WHERE id = ? AND lease = ?",
                            (time.time(), self.run, self.number),
                        )
                except sqlite3.Error:
                    pass  # a busy database: the next beat comes well before STALE_AFTER
        finally:
            connection.close()

    def _end(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), which tells a process apart
    from a later one that got the same id; None where /proc does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _holder() -> str:
    pid = os.getpid()
    return f"{pid}@{socket.gethostname()}@{_start_time(pid) or ''}"


def _pid_alive(pid: int, started: str) -> bool:
    """Whether the process that took the lease still runs on this host: the id exists, is not a
    zombie (what ``kill -9`` leaves until the parent reaps it), and started when the holder did."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS): trust kill(0)
        return True
    fields = stat.rpartition(")")[2].split()
    if fields[:1] == ["Z"]:
        return False
    return not started or len(fields) <= 19 or fields[19] == started


def _holder_alive(holder: str, heartbeat: float | None, now: float) -> bool:
    """Whether the lease's holder still runs. On this host the process table decides at once
    (a killed holder never blocks); a holder on another host counts as gone once its heartbeat
    is older than STALE_AFTER."""
    pid_text, _, rest = holder.partition("@")
    host, _, started = rest.partition("@")
    if host == socket.gethostname() and pid_text.isdigit():
        return _pid_alive(int(pid_text), started)
    return heartbeat is not None and now - heartbeat <= STALE_AFTER


def _describe_holder(holder: str, heartbeat: float | None, now: float) -> str:
    pid, _, rest = holder.partition("@")
    host = rest.partition("@")[0]
    beat = f" (last heartbeat {now - heartbeat:.0f} s ago)" if heartbeat is not None else ""
    return f"process {printable(pid)} on {printable(host)}{beat}"


def _check_value(path: Path, table: str, key: object, column: str, value: object) -> None:
    if column not in _TYPES:
        return
    types, nullable, wanted = _TYPES[column]
    if value is None and nullable:
        return
    if isinstance(value, types) and not isinstance(value, bool):
        return
    shown = printable(repr(value)[:60])
    raise SearchError(
        f"{printable(str(path))}: {table} row {printable(repr(key)[:80])}: the column {column} holds {shown}, "
        f"expected {wanted}; this row was not written by kdsl (delete it or use another database)"
    )


def candidate(db: str | Path, key: str) -> Any:
    """The operator (or branching kernel) stored under ``key`` or a unique prefix of it in the
    results database ``db``, read-only; a :class:`SearchError` that says how many keys match
    otherwise."""
    store = Store(db, readonly=True)
    try:
        rows = store.find(key)
    finally:
        store.close()
    if len(rows) != 1:
        found = "no candidate" if not rows else f"{len(rows)} candidates"
        raise SearchError(
            f"{found} in {printable(str(db))} has a key starting with {printable(key)!r}; give more of the hash"
        )
    return parse(rows[0][1])


class Store:
    """A results database at ``path`` (created if missing; its folder must exist).

    ``readonly=True`` opens an existing database without writing anything to it."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        path = Path(path)
        self.path = path
        self.readonly = readonly
        self._leases: list[Lease] = []
        if readonly and not path.exists():
            raise SearchError(f"no results database at {str(path)!r}; run `kdsl search ... --db {path}` first")
        # one SQLite layer for every store: WAL, busy timeout, explicit BEGIN IMMEDIATE transactions
        self.database = Database(
            path, schema=None if readonly else _SCHEMA, readonly=readonly, what="results database", error=SearchError
        )
        self.connection = self.database.connection
        try:
            if not readonly:
                self._add_lease_columns()
                self._add_candidate_columns()
            self._check_schema()
        except (SearchError, sqlite3.DatabaseError) as error:
            self._close_quietly()
            if isinstance(error, SearchError):
                raise
            raise SearchError(f"cannot use {str(path)!r} as a results database: {error}") from None

    def _close_quietly(self) -> None:
        self.database.close()

    def _columns(self, table: str) -> set[str]:
        return {row[1] for row in self.connection.execute(f"PRAGMA table_info({table})")}

    def _add_lease_columns(self) -> None:
        have = self._columns("runs")
        for name, declaration in _LEASE_COLUMNS.items():
            if name not in have:
                self.connection.execute(f"ALTER TABLE runs ADD COLUMN {name} {declaration}")

    def _add_candidate_columns(self) -> None:
        have = self._columns("candidates")
        for name, declaration in _CANDIDATE_COLUMNS.items():
            if name not in have:
                self.connection.execute(f"ALTER TABLE candidates ADD COLUMN {name} {declaration}")
        self.connection.execute("CREATE INDEX IF NOT EXISTS candidates_by_semantic ON candidates (semantic)")

    def families(self, pattern: str) -> list[tuple[str, int | None, str]]:
        """``(key, rank or None, dsl)`` of the stored valid candidates (duplicates are not valid) whose
        function family has this equality pattern (:func:`kdsl.search.semantic.pattern_key`);
        empty for a database written before fingerprints."""
        if "semantic" not in self._columns("candidates"):
            return []
        rows = self.connection.execute(
            "SELECT key, semantic_rank, dsl FROM candidates WHERE semantic = ? AND status = 'valid' "
            "ORDER BY created, key",
            (pattern,),
        ).fetchall()
        return [(str(k), int(r) if isinstance(r, int) else None, str(d)) for k, r, d in rows]

    def _check_schema(self) -> None:
        have = self._columns("candidates")
        if not have:
            raise SearchError(f"{str(self.path)!r} is not a kdsl results database: it has no candidates table")
        missing = [column for column in _REQUIRED if column not in have]
        if missing:
            raise SearchError(
                f"{str(self.path)!r} is not a kdsl results database: its candidates table has no column "
                + ", ".join(missing)
            )

    def close(self) -> None:
        # a lease not given back stops beating, so another process can take it once this one exits
        for lease in self._leases:
            lease._end()
        self.database.close()

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction, taken with BEGIN IMMEDIATE so that reading the lease and
        writing under it are atomic against every other writer."""
        return self.database.write()

    def set_reward(self, key: str, value: float) -> None:
        """Replace a candidate's reward by a measured one (the main job feeds MCTS this way)."""
        with self._write() as connection:
            connection.execute("UPDATE candidates SET reward = ? WHERE key = ?", (value, key))

    def find(self, prefix: str) -> list[tuple[str, str]]:
        """``(key, dsl)`` of the candidates whose key starts with ``prefix``."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return [
            (str(k), str(d))
            for k, d in self.database.rows(
                "SELECT key, dsl FROM candidates WHERE key LIKE ? ESCAPE '\\'", (escaped + "%",)
            )
        ]

    def claim(self, fingerprint: str, strategy: str, seed: int, description: str) -> Lease:
        """Create the run for (space, strategy, seed) if new and take its lease; return the lease
        with the run's saved progress. Refuses (:class:`SearchError`) while another live process
        holds the run."""
        now = time.time()
        with self._write() as connection:
            connection.execute(
                "INSERT OR IGNORE INTO runs (fingerprint, strategy, seed, description, created, updated) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (fingerprint, strategy, seed, description, now, now),
            )
            run, progress, holder, number, heartbeat = connection.execute(
                "SELECT id, progress, holder, lease, heartbeat FROM runs "
                "WHERE fingerprint = ? AND strategy = ? AND seed = ?",
                (fingerprint, strategy, seed),
            ).fetchone()
            if holder and _holder_alive(holder, heartbeat, now):
                raise SearchError(
                    f"the {strategy} run with seed {seed} of this space in {str(self.path)!r} is in use by "
                    f"{_describe_holder(holder, heartbeat, now)}; wait for it to finish or stop it "
                    f"(a search with another --seed may run beside it)"
                )
            saved = self._json(run, "progress", progress, table="runs")
            if not isinstance(saved, dict):
                raise SearchError(
                    f"{printable(str(self.path))}: runs row {run}: the column progress holds "
                    f"{printable(repr(progress)[:60])}, not a JSON object; delete this run's row to start it over"
                )
            number = int(number or 0) + 1
            connection.execute(
                "UPDATE runs SET holder = ?, lease = ?, heartbeat = ? WHERE id = ?", (_holder(), number, now, run)
            )
        lease = Lease(int(run), number, saved)
        lease._start(self.path)
        self._leases.append(lease)
        return lease

    def _fence(self, connection: sqlite3.Connection, lease: Lease) -> None:
        row = connection.execute("SELECT lease, holder, heartbeat FROM runs WHERE id = ?", (lease.run,)).fetchone()
        if row is None or row[0] != lease.number:
            holder = _describe_holder(row[1], row[2], time.time()) if row and row[1] else "another process"
            raise SearchError(
                f"this search lost its run in {str(self.path)!r} to {holder}, which found no heartbeat from it "
                f"for {STALE_AFTER:.0f} s; its unsaved results were not written (the other search finds them again)"
            )

    def release(self, lease: Lease) -> None:
        """Give the run back (a no-op when the lease was lost meanwhile)."""
        lease._end()
        with self._write() as connection:
            connection.execute("UPDATE runs SET holder = NULL WHERE id = ? AND lease = ?", (lease.run, lease.number))

    def finished(self, run: int) -> bool:
        row = self.connection.execute("SELECT finished FROM runs WHERE id = ?", (run,)).fetchone()
        return bool(row and row[0])

    def known(self, key: str) -> bool:
        return self.connection.execute("SELECT 1 FROM candidates WHERE key = ?", (key,)).fetchone() is not None

    def get(self, key: str) -> dict[str, Any] | None:
        cursor = self.connection.execute("SELECT * FROM candidates WHERE key = ?", (key,))
        row = cursor.fetchone()
        return self._row(cursor, row, "candidates") if row else None

    def get_many(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The rows of those of ``keys`` that are stored, by key (as :meth:`get` gives each)."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(wanted), 500):  # SQLite's limit on bound parameters
            chunk = wanted[start : start + 500]
            cursor = self.connection.execute(
                f"SELECT * FROM candidates WHERE key IN ({','.join('?' * len(chunk))})", chunk
            )
            for row in cursor.fetchall():
                item = self._row(cursor, row, "candidates")
                found[item["key"]] = item
        return found

    def strategies_of(self, keys: Iterable[str]) -> dict[str, str | None]:
        """The strategy that stored each of ``keys`` (None for a row without one)."""
        return {key: row.get("strategy") for key, row in self.get_many(keys).items()}

    def found_by(self, strategy: str) -> set[str]:
        """The keys of the candidates ``strategy`` stored (the strategy that found each first)."""
        rows = self.connection.execute("SELECT key FROM candidates WHERE strategy = ?", (strategy,)).fetchall()
        return {str(row[0]) for row in rows}

    def strategy_counts(self, status: str = "valid") -> dict[str | None, int]:
        """How many candidates of ``status`` each strategy stored."""
        query = "SELECT strategy, COUNT(*) FROM candidates WHERE status = ? GROUP BY strategy"
        return {strategy: count for strategy, count in self.connection.execute(query, (status,))}

    def commit(
        self,
        lease: Lease,
        rows: Iterable[Mapping[str, Any]],
        progress: Mapping[str, Any],
        *,
        finished: bool = False,
        release: bool = False,
    ) -> None:
        """Insert new candidates (a known key is left as it is) and save the run's progress,
        atomically and only while ``lease`` is still the run's; ``release`` also gives the run
        back in the same transaction."""
        now = time.time()
        if release:
            lease._end()
        with self._write() as connection:
            self._fence(connection, lease)
            for row in rows:
                connection.execute(
                    "INSERT OR IGNORE INTO candidates (key, dsl, depth, status, error, flops, params, flops_per_layer, "
                    "params_per_layer, reward, strategy, seed, run, metrics, created, updated, semantic, "
                    "semantic_rank) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                        lease.run,
                        json.dumps(row.get("metrics", {}), sort_keys=True),
                        now,
                        now,
                        row.get("semantic"),
                        row.get("semantic_rank"),
                    ),
                )
            connection.execute(
                "UPDATE runs SET progress = ?, finished = ?, updated = ?, heartbeat = ?, "
                "holder = CASE WHEN ? THEN NULL ELSE holder END WHERE id = ?",
                (json.dumps(progress, sort_keys=True), int(finished), now, now, int(release), lease.run),
            )

    def top(self, k: int = 10, status: str | None = "valid", strategy: str | None = None) -> list[dict[str, Any]]:
        """The best ``k`` candidates by reward (then fewest FLOPs); only those ``strategy`` found
        first, when given (each row's ``strategy`` is the strategy that stored it)."""
        conditions = [(column, value) for column, value in (("status", status), ("strategy", strategy)) if value]
        where = ("WHERE " + " AND ".join(f"{column} = ?" for column, _ in conditions)) if conditions else ""
        args: tuple = tuple(value for _, value in conditions)
        cursor = self.connection.execute(
            f"SELECT * FROM candidates {where} ORDER BY reward DESC, flops ASC, key ASC LIMIT ?", (*args, int(k))
        )
        return [self._row(cursor, row, "candidates") for row in cursor.fetchall()]

    def counts(self) -> dict[str, int]:
        """How many candidates have each status."""
        found: dict[str, int] = {}
        for status, count in self.connection.execute("SELECT status, COUNT(*) FROM candidates GROUP BY status"):
            _check_value(self.path, "candidates", status, "status", status)
            found[status] = count
        return found

    def runs(self) -> list[dict[str, Any]]:
        cursor = self.connection.execute(
            "SELECT id, strategy, seed, description, progress, finished, holder FROM runs ORDER BY id"
        )
        return [self._row(cursor, row, "runs") for row in cursor.fetchall()]

    def _json(self, key: object, column: str, text: object, *, table: str = "candidates") -> Any:
        if text is None:
            return None
        try:
            if not isinstance(text, str):
                raise TypeError(text)
            return json.loads(text)
        except (TypeError, ValueError):
            shown = printable(repr(text)[:60])
            raise SearchError(
                f"{printable(str(self.path))}: {table} row {printable(repr(key)[:80])}: the column {column} holds "
                f"{shown}, which is not JSON text; this row was not written by kdsl (delete it or use another database)"
            ) from None

    def _row(self, cursor: sqlite3.Cursor, row: tuple, table: str) -> dict[str, Any]:
        item = {description[0]: value for description, value in zip(cursor.description, row)}
        key = item.get("key", item.get("id"))
        for column, value in item.items():
            if column in _JSON_COLUMNS:
                item[column] = self._json(key, column, value, table=table)
            else:
                _check_value(self.path, table, key, column, value)
        return item

"""Tuning records: the store every tuner writes to, a task's identity, and the tuner interface.

A *task* is one operator at one layer on this machine's target, in one kernel signature (:func:`task_key`).
Every measured configuration becomes a :class:`Record` in one SQLite :class:`RecordStore`; tuners see a
task's records as their history, so a run resumes where it stopped and never measures a stored
configuration again.

>>> store = RecordStore(":memory:")
>>> store.add("task", Record({"a": 1}, 0.002, None, "opevo"))
>>> store.add("task", Record({"a": 2}, None, "invalid: no", "opevo"))
>>> [r.latency for r in store.records("task")], store.best("task").config
([0.002, None], {'a': 1})
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kdsl import solve
from kdsl.codegen.tvm import default_target
from kdsl.codegen.tvm.parameters import config_key, normalize
from kdsl.codegen.tvm.schedule_space import VERSION
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.runtime.storage import Database


class TuneError(KdslError):
    """A tuning run that cannot go on (an unknown tuner, a broken records database, ...)."""


def is_integer(value: object) -> bool:
    """Whether a tuner option is an integer (``True`` is not: a flag given where a count was meant).

    >>> is_integer(8), is_integer(True), is_integer(0.5)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether a tuner option is an int or a float (not a bool).

    >>> is_number(0.5), is_number(False)
    (True, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class Record:
    """One tried configuration: its latency in seconds, or the reason it is invalid."""

    config: dict[str, Any]
    latency: float | None
    error: str | None
    tuner: str
    key: str = ""
    at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.config = normalize(self.config)
        if not self.key:
            self.key = config_key(self.config)

    @property
    def fitness(self) -> float:
        """1 / latency, or 0 for an invalid configuration (OpEvo's rule)."""
        return 0.0 if self.latency is None or self.latency <= 0 else 1.0 / self.latency


# ------------------------------------------------------------------------------------------------
# The records store
# ------------------------------------------------------------------------------------------------


_RECORDS_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (task TEXT NOT NULL, key TEXT NOT NULL, config TEXT NOT NULL, latency REAL,
    error TEXT, tuner TEXT NOT NULL, at REAL NOT NULL, seq INTEGER PRIMARY KEY, UNIQUE (task, tuner, key));
CREATE TABLE IF NOT EXISTS tasks (task TEXT PRIMARY KEY, description TEXT NOT NULL, at REAL NOT NULL);
"""


class RecordStore:
    """Tuning records in SQLite, one row per (task, configuration): adding a known one is a no-op."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.database = Database(self.path, schema=_RECORDS_SCHEMA, what="tuning records", error=TuneError)
        self.db = self.database.connection

    def describe(self, task: str, description: Mapping[str, Any]) -> None:
        """Remember what a task key stands for (operator, layer, target)."""
        self.db.execute(
            "INSERT OR IGNORE INTO tasks VALUES (?, ?, ?)", (task, json.dumps(description, sort_keys=True), time.time())
        )

    def add(self, task: str, record: Record) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO records (task, key, config, latency, error, tuner, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (task, record.key, json.dumps(record.config), record.latency, record.error, record.tuner, record.at),
        )

    def confirm(self, task: str, key: str, tuner: str, latency: float) -> None:
        """Replace a record's latency by a re-measured one (the fastest of its timings)."""
        self.db.execute(
            "UPDATE records SET latency = ? WHERE task = ? AND key = ? AND tuner = ?", (latency, task, key, tuner)
        )

    def other_targets(self, task: str, mine: Mapping[str, Any]) -> list[str]:
        """The targets (mcpu names) of the tasks with measured records for the operator and sizes of
        ``task``, described by ``mine`` (:func:`task_description`; the database need not describe it), on
        other targets (records are kept per target)."""
        found = set()
        query = "SELECT t.description FROM tasks t WHERE t.task != ? AND EXISTS "
        query += "(SELECT 1 FROM records r WHERE r.task = t.task AND r.latency IS NOT NULL)"
        for (text,) in self.db.execute(query, (task,)).fetchall():
            other = json.loads(text)
            same = all(
                other.get(name) == mine.get(name) for name in ("op", "binding", "channel_block", "prepacked_weights")
            )
            if same:
                found.add(str(other.get("target", "")))
        return sorted(found - {str(mine.get("target", ""))})

    def descriptions(self) -> dict[str, dict[str, Any]]:
        """Every described task and what it stands for (operator key, binding, target; the operator's JSON
        and the space's version where the run that described it stored them)."""
        out = {}
        for task, text in self.db.execute("SELECT task, description FROM tasks ORDER BY at").fetchall():
            try:
                description = json.loads(text)
            except (TypeError, ValueError):  # a row another program wrote: no task kdsl can describe
                continue
            if isinstance(description, dict):
                out[str(task)] = description
        return out

    def records(self, task: str, tuner: str | None = None) -> list[Record]:
        """The task's records in the order they were added (of one tuner, if given)."""
        query = "SELECT config, latency, error, tuner, key, at FROM records WHERE task = ?"
        args: tuple[Any, ...] = (task,)
        if tuner is not None:
            query += " AND tuner = ?"
            args += (tuner,)
        rows = self.db.execute(query + " ORDER BY seq", args).fetchall()
        return [Record(json.loads(c), lat, err, t, k, at) for c, lat, err, t, k, at in rows]

    def known(self, task: str, key: str, tuner: str | None = None) -> Record | None:
        """The stored record of configuration ``key`` (by ``tuner``, if given; measured ones first)."""
        query = "SELECT config, latency, error, tuner, key, at FROM records WHERE task = ? AND key = ?"
        args: tuple[Any, ...] = (task, key)
        if tuner is not None:
            query += " AND tuner = ?"
            args += (tuner,)
        row = self.db.execute(query + " ORDER BY latency IS NULL, seq LIMIT 1", args).fetchone()
        return None if row is None else Record(json.loads(row[0]), row[1], row[2], row[3], row[4], row[5])

    def best(self, task: str, tuner: str | None = None) -> Record | None:
        """The fastest valid record of the task (of one tuner, if given)."""
        valid = [r for r in self.records(task, tuner) if r.latency is not None]
        return min(valid, key=lambda r: r.latency or 0.0) if valid else None


def task_key(op: Operator, binding: Mapping[str, int], target: str, block: int = 0, prepacked: bool = False) -> str:
    """The key of a tuning task: the operator's structure, its sizes, the target and the space's version,
    and the kernel's signature: ``block > 0`` is a kernel whose data input and output are
    channel-blocked by ``block`` (:mod:`kdsl.codegen.tvm.signature_layout`), ``prepacked`` one that takes
    the weights its schedule packs already packed (:mod:`kdsl.codegen.tvm.prepack`), each a task of its
    own, since its records time other memory accesses (a part of the key only when set: the plain
    signature's key is the one it always was)."""
    parts: list[Any] = [op.key, sorted(binding.items()), target, VERSION]
    if block:
        parts.append(["channel block", block])
    if prepacked:
        parts.append(["prepacked weights", True])
    return hashlib.sha1(json.dumps(parts).encode()).hexdigest()[:20]


# ------------------------------------------------------------------------------------------------
# The tuner interface
# ------------------------------------------------------------------------------------------------


class Tuner(Protocol):
    """A search over one space: propose a batch, receive its records, propose again."""

    name: str

    def propose(self, n: int) -> list[dict[str, Any]]:
        """Up to ``n`` configurations, none proposed before (nor in the history it was given)."""
        ...

    def update(self, records: Sequence[Record]) -> None:
        """The results of proposed configurations (latency ``None``: invalid, fitness 0)."""
        ...


@dataclass
class TuneResult:
    """The outcome of one tuning run: the best record and the best latency after each measured trial."""

    task: str
    tuner: str
    best: Record | None
    curve: list[float]  # best seconds so far after each measurement of this run (inf before a valid one)
    measured: int
    rejected: int
    seconds: float
    library: str | None = None  # a compiled library of the best schedule, when the tuner kept one
    ranking: Any = None  # the cross-operator cost model's held-out Ranking on this run (kdsl.tune.transfer)
    refused: int = 0  # distinct candidates the space refused (tuners' checks and the driver's; rejected among them)


def target_mcpu() -> str:
    """The mcpu of the target tuning records are kept for (``--mcpu`` / ``KDSL_MCPU``, else the host's)."""
    return str(default_target().attrs.get("mcpu", ""))


def open_task(
    op: Operator,
    layer: Mapping[str, int],
    db: str | os.PathLike[str],
    block: int = 0,
    prepacked: bool = False,
    *,
    describe: bool = True,
) -> tuple[dict[str, int], str, RecordStore]:
    """The binding of ``op`` at ``layer``, its task key on this machine (``block``: of the kernel with a
    channel-blocked signature; ``prepacked``: of the kernel that takes its packed weights packed;
    :func:`task_key`), and the records store, the task described in it unless ``describe`` is false (a
    reader that only looks records up must not add a task that was never tuned)."""
    if not is_integer(block) or block < 0:
        raise TuneError(f"the channel block of a task must be a non-negative integer (0: plain), got {block!r}")
    if not isinstance(prepacked, bool):
        raise TuneError(f"the prepacked flag of a task must be True or False, got {prepacked!r}")
    binding = solve.bind(op, layer)
    mcpu = target_mcpu()
    key = task_key(op, binding, mcpu, block, prepacked)
    store = RecordStore(db)
    if describe:
        store.describe(key, task_description(op, binding, mcpu, block, prepacked))
    return binding, key, store


def task_description(
    op: Operator, binding: Mapping[str, int], mcpu: str, block: int = 0, prepacked: bool = False
) -> dict[str, Any]:
    """What a task key stands for, as the records database keeps it: the operator's JSON and the space's
    version let a cost model trained across tasks rebuild the space; the channel block and the prepacked
    flag appear only when set, so a plain task's description stays as it was."""
    description = {"op": op.key, "binding": dict(binding), "target": mcpu, "json": op.to_json(), "space": VERSION}
    if block:
        description["channel_block"] = block
    if prepacked:
        description["prepacked_weights"] = True
    return description

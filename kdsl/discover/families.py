"""Candidates by family: what each candidate is, and which ones discover trains.

Search stores one operator per function family (:mod:`kdsl.search.semantic`: equal up to a
re-parametrization of the weights and a roll or flip of the spatial output). Discover goes one step
further before it spends a training run: a candidate whose *base* (its family once its ``Shift``
steps are removed, :func:`kdsl.search.provenance.without_shifts`) and coefficient values are those
of a candidate already screened or trained is a repeat (a known design with shifts moved about
trains as well as the design), and is recorded as such instead of trained. Each candidate's
provenance (:func:`kdsl.search.provenance.describe`) is computed once, when discover first looks at
it, and kept in the ``provenance`` table of the run's database, which the report reads.

>>> import os, tempfile
>>> from kdsl import gallery
>>> table = FamilyTable(os.path.join(tempfile.mkdtemp(), "runs.sqlite"))
>>> found = table.classify({"key": "k1", "dsl": gallery.load("grouped_conv2d").to_dsl(), "metrics": {}})
>>> found.kind, table.get(["k1"])["k1"]["line"]
('known', 'is `grouped_conv2d` (G=4, K=3)')
>>> table.close()
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from kdsl.lang.errors import KdslError, SearchError
from kdsl.lang.parser import parse
from kdsl.runtime.storage import Database
from kdsl.search.provenance import UNCOMPARED, Provenance, describe

__all__ = ["FamilyTable", "annotate", "provenance_of", "training_key"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS provenance (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    line TEXT NOT NULL,
    family TEXT NOT NULL,
    base TEXT NOT NULL,
    design TEXT,
    coefficients TEXT NOT NULL,
    repeat_of TEXT,
    created REAL NOT NULL
);
"""

#: the fields of a provenance row that records carry (``line`` becomes the record's ``provenance``)
FIELDS = ("kind", "line", "family", "base", "design", "coefficients", "repeat_of")


def training_key(provenance: Provenance) -> str:
    """What discover trains once: the base family and the coefficient values.

    >>> from kdsl.search.provenance import Provenance
    >>> training_key(Provenance("known", "is x", "f1", "b1", "x", (("G", 2),)))
    'b1|G=2'
    """
    return provenance.base + "|" + ",".join(f"{k}={v}" for k, v in provenance.coefficients)


def provenance_of(dsl: str, metrics: Mapping[str, Any] | None = None) -> Provenance:
    """The provenance of a stored candidate: its DSL text and the search metrics that say where it
    came from (a gallery neighbour's ``origin`` and ``rewrites``)."""
    try:
        op = parse(dsl)
    except KdslError as error:  # a database written by another version: say so, never crash
        return Provenance(UNCOMPARED, f"unreadable: {error.message[:80]}", "unreadable", "unreadable")
    return describe(op, origin=metrics or {})


class FamilyTable:
    """The ``provenance`` table of a discovery database (beside search's ``candidates``)."""

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        self.database = Database(
            path, schema=None if readonly else _SCHEMA, readonly=readonly, what="results database", error=SearchError
        )
        self.present = bool(self.database.columns("provenance"))

    def get(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The stored provenance of each of ``keys`` that has one."""
        wanted = list(dict.fromkeys(keys)) if self.present else []
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(wanted), 500):  # SQLite's limit on bound parameters
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT key, {', '.join(FIELDS)} FROM provenance WHERE key IN ({marks})"
            for key, *values in self.database.rows(query, chunk):
                row = dict(zip(FIELDS, values))
                row["coefficients"] = _coefficients(row["coefficients"])
                found[key] = row
        return found

    def classify(self, row: Mapping[str, Any]) -> Provenance:
        """The provenance of a search store row (``key``, ``dsl``, ``metrics``), stored."""
        provenance = provenance_of(row["dsl"], row.get("metrics"))
        self._put(row["key"], provenance, None)
        return provenance

    def mark_repeat(self, key: str, of: str) -> None:
        """Record that ``key`` is not trained: ``of`` was, with the same base and coefficients."""
        with self.database.write() as connection:
            connection.execute("UPDATE provenance SET repeat_of = ? WHERE key = ?", (of, key))

    def training_keys(self, keys: Iterable[str]) -> dict[str, str]:
        """``training_key -> key`` over those of ``keys`` that were classified and not repeats."""
        taken: dict[str, str] = {}
        for key, row in self.get(keys).items():
            if row["repeat_of"] is None:
                provenance = Provenance(
                    row["kind"],
                    row["line"],
                    row["family"],
                    row["base"],
                    row["design"],
                    tuple(row["coefficients"].items()),
                )
                taken.setdefault(training_key(provenance), key)
        return taken

    def _put(self, key: str, provenance: Provenance, repeat_of: str | None) -> None:
        with self.database.write() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO provenance VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    provenance.kind,
                    provenance.line,
                    provenance.family,
                    provenance.base,
                    provenance.design,
                    json.dumps(dict(provenance.coefficients)),
                    repeat_of,
                    time.time(),
                ),
            )

    def close(self) -> None:
        self.database.close()


def _coefficients(text: object) -> dict[str, int]:
    try:
        value = json.loads(str(text))
    except ValueError:
        return {}
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int)} if isinstance(value, dict) else {}


def annotate(records: Iterable[dict[str, Any]], stored: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Give each record (``key``, ``dsl``, and the search ``metrics`` where known) its
    provenance fields in place: ``kind``, ``provenance`` (the line), ``family``, ``base``,
    ``design``: from ``stored`` rows where present, else computed."""
    stored = stored or {}
    for record in records:
        row = stored.get(record["key"])
        if row is None:
            if not record.get("dsl"):
                continue
            found = provenance_of(record["dsl"], record.get("search_metrics"))
            row = found.as_dict() | {"repeat_of": None}
        record["kind"] = row["kind"]
        record["provenance"] = row["line"]
        for field in ("family", "base", "design"):
            record[field] = row[field]

"""Using what a tuning run found: the best record of a task, its schedule as readable lines, and a kernel
(or a shared library) built with it.

``kdsl tune`` stores every measured configuration in a records database (:mod:`kdsl.tune.records`);
:func:`apply` turns the best one for an operator at a layer into a compiled kernel, called like
:func:`kdsl.codegen.tvm.build`'s::

    kernel = kdsl.tune.apply("tune.db", op, {"N": 1, "Cin": 64, "Cout": 64, "H": 56, "W": 56})
    y = kernel(x, w)

The schedule of a record is a plain dict of named parameters (``conv.tile.h: [7, 2, 4]``,
``conv.order: [...]``); :func:`schedule_lines` prints it one parameter a line.

>>> schedule_lines({"y.tile.i": [2, 4, 1], "y.unroll": 16, "x.inline": True})
['x.inline     True', 'y.tile.i     2 x 4 x 1', 'y.unroll     16']
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kdsl import solve
from kdsl.codegen.tvm import build
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.lang.operator import Operator
from kdsl.tune.records import Record, TuneError, open_task, target_mcpu, task_description

__all__ = ["apply", "best_record", "export", "schedule_lines", "tuned_schedule"]


def _applicable(record: Record) -> bool:
    """A configuration of kdsl's schedule space (MetaSchedule's records hold a trace of its own instead)."""
    return "trace" not in record.config


def best_record(
    db: str | os.PathLike[str],
    op: Operator,
    layer: Mapping[str, int],
    tuner: str | None = None,
    block: int = 0,
    prepacked: bool = False,
) -> Record:
    """The fastest measured record of ``op`` at ``layer`` in the records database ``db`` (of one
    ``tuner`` if given; ``block > 0``: of the kernel with that channel-blocked signature; ``prepacked``:
    of the kernel tuned with its packed weights taken packed; each a task of its own) whose schedule kdsl
    can apply; :class:`TuneError` if there is none, saying why."""
    if not Path(db).is_file():
        raise TuneError(f"no tuning records database at {db}; run kdsl tune first")
    binding, task, store = open_task(op, layer, db, block, prepacked, describe=False)
    try:
        records = [r for r in store.records(task, tuner) if r.latency is not None]
        elsewhere = (
            [] if records else store.other_targets(task, task_description(op, binding, target_mcpu(), block, prepacked))
        )
    finally:
        store.database.close()
    usable = [r for r in records if _applicable(r)]
    if not usable:
        which = (f" by {tuner}" if tuner else "") + (f" with channel block {block}" if block else "")
        which += " with prepacked weights" if prepacked else ""
        layer_text = ", ".join(f"{k}={v}" for k, v in sorted(layer.items()))
        if records:  # only MetaSchedule's: its best kernel is the library it kept, not a record
            raise TuneError(
                f"{db} holds only MetaSchedule records{which} for this operator at {layer_text}; tune with "
                f"opevo, gensor, alt or random to get a schedule kdsl can apply"
            )
        if elsewhere:  # tuned for another target: records are kept per mcpu
            raise TuneError(
                f"{db} has no measured schedule{which} for this operator at {layer_text} for this target "
                f"(mcpu {target_mcpu()}), only for mcpu {', '.join(elsewhere)}: add --mcpu {elsewhere[0]} "
                f"(records are kept per target)"
            )
        raise TuneError(
            f"{db} has no measured schedule{which} for this operator at {layer_text} on this machine; "
            f"run kdsl tune with the same operator and --layers first"
        )
    return min(usable, key=lambda r: r.latency or 0.0)


def _record(
    source: str | os.PathLike[str] | Record | Mapping[str, Any],
    op: Operator,
    layer: Mapping[str, int],
    tuner: str | None,
    prepacked: bool = False,
) -> Record:
    if isinstance(source, Record):
        return source
    if isinstance(source, Mapping):  # a configuration, as `kdsl tune --json` prints it
        return Record(dict(source), None, None, tuner or "given")
    return best_record(source, op, layer, tuner, prepacked=prepacked)


def apply(
    source: str | os.PathLike[str] | Record | Mapping[str, Any],
    op: Operator,
    layer: Mapping[str, int],
    *,
    tuner: str | None = None,
    dtype: str = "float32",
    prepacked: bool = False,
) -> Any:
    """A compiled TVM kernel of ``op`` at ``layer`` with a tuned schedule: the best record of a records
    database (a path), a :class:`~kdsl.tune.records.Record`, or a configuration dict. The kernel is
    the one :func:`kdsl.codegen.tvm.build` returns (callable on torch tensors, autograd included),
    only scheduled differently; a schedule never changes what the kernel computes. ``prepacked``: the
    best record of the prepacked task, built with ``prepacked_weights=True`` (pack the weights once with
    ``kernel.pack_weights``; forward only)."""
    record = _record(source, op, layer, tuner, prepacked)
    if not _applicable(record):
        raise TuneError("a MetaSchedule record holds a trace, not a kdsl schedule; it cannot be applied")
    return build(
        op,
        layer,
        dtype=dtype,
        schedule=lambda lowered: ScheduleSpace(lowered).apply(record.config),
        prepacked_weights=prepacked,
    )


def export(
    source: str | os.PathLike[str] | Record | Mapping[str, Any],
    op: Operator,
    layer: Mapping[str, int],
    path: str | os.PathLike[str],
    *,
    tuner: str | None = None,
    prepacked: bool = False,
) -> Path:
    """Compile the tuned schedule (as :func:`apply` finds it) into a shared library at ``path``, with
    its description beside it (``path + ".json"``): :func:`kdsl.codegen.tvm.load` loads it as a
    kernel called like :func:`apply`'s, ``kernel(x, *weights)``. (Its ``main``, which
    ``tvm.runtime.load_module(path)["main"]`` gives, takes the input, the weights and the output.)
    ``prepacked``: the kernel with prepacked weights, its weights' packed layouts in the description
    (call the loaded kernel with ``kernel.pack_weights(*weights)``'s tensors)."""
    return apply(source, op, solve.bind(op, layer), tuner=tuner, prepacked=prepacked).export(path)


def schedule_lines(config: Mapping[str, Any]) -> list[str]:
    """One line per schedule parameter, sorted: tile factors as ``a x b x c``, the rest as they are."""
    width = max((len(name) for name in config), default=0) + 5
    lines = []
    for name in sorted(config):
        value = config[name]
        shown = " x ".join(map(str, value)) if isinstance(value, list | tuple) and ".tile." in name else value
        if isinstance(shown, list | tuple):
            shown = ", ".join(map(str, shown))
        lines.append(f"{name:<{width}}{shown}")
    return lines


def tuned_schedule(
    db: str | os.PathLike[str],
    op: Operator,
    layer: Mapping[str, int],
    block: int = 0,
    prepacked: bool = False,
    *,
    fallback: bool = False,
) -> Callable[[Any], Any] | None:
    """The schedule (a ``Lowered -> Schedule`` function, as :func:`kdsl.codegen.tvm.build` takes it)
    of the best applicable record of ``op`` at ``layer`` in ``db``, or ``None`` when ``db`` holds
    none for this target: what ``kdsl discover`` times a candidate with when tuned records exist.
    ``block > 0``: the best record of the kernel tuned with that channel-blocked signature (the
    schedule to give :func:`kdsl.codegen.tvm.signature_layout.build_blocked`); a plain record never
    stands in for it. ``prepacked``: the best record of the kernel tuned with its packed weights taken
    packed (``build(..., prepacked_weights=True)``); with ``fallback``, where that task (prepacked or per
    call) has no record, the best record of the same kernel tuned with the weights packed the other way
    (a schedule applies to both: only what was timed differs).

    >>> tuned_schedule("no-such-records.db", None, {}) is None
    True
    """
    if not Path(db).is_file():
        return None
    tries = (prepacked, not prepacked) if fallback else (prepacked,)
    for packed in tries:
        try:
            record = best_record(db, op, layer, block=block, prepacked=packed)
        except TuneError:
            continue
        return lambda lowered: ScheduleSpace(lowered).apply(record.config)
    return None

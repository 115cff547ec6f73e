"""The tuning driver: pick a tuner by name and run it against the measurer and the records store.

Tuners search the schedule space of :mod:`kdsl.codegen.tvm.schedule_space` through one interface
(:class:`~kdsl.tune.records.Tuner`): ``propose(n)`` returns up to ``n`` configurations never proposed
before and ``update(records)`` feeds back their measured results. :func:`tune` drives one against a
:class:`~kdsl.tune.measurer.Measurer` and a :class:`~kdsl.tune.records.RecordStore`: re-running with the
same database continues from the stored records.

The cross-operator cost model (:mod:`kdsl.tune.transfer`), trained on the other tasks of this target in
``db`` and ``cost_model_db`` (never on the task tuned), ranks the candidates of opevo, alt and random
before measurement (:data:`PREFILTER` drawn per one measured) when at least
:data:`~kdsl.tune.transfer.MIN_TASKS` such tasks exist (``cost_model=False``: never); the result's
``ranking`` is its held-out rank correlation on the run's measured configurations beside the analytic
estimate's, logged as one line.

``tune(..., block=16)`` tunes the kernel whose data input and output are channel-blocked by 16
(:mod:`kdsl.codegen.tvm.signature_layout`; what a network built blocked runs), a task of its own in the
records (:func:`~kdsl.tune.records.task_key`), measured on blocked buffers (:mod:`kdsl.tune.measurer`).
``tune(..., prepacked=True)`` tunes the kernel that takes the weights its schedule packs already packed
(:mod:`kdsl.codegen.tvm.prepack`; what a compiled network runs), a task of its own too, its weights packed
once by the measurer and only the kernel timed.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kdsl.codegen.tvm import lower
from kdsl.codegen.tvm.parameters import config_key, normalize
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.lang.errors import LoweringError
from kdsl.lang.operator import Operator
from kdsl.runtime.progress import Progress
from kdsl.runtime.units import duration
from kdsl.tune.alt import Alt, check_alt_options
from kdsl.tune.gensor import Gensor
from kdsl.tune.measurer import Measurer, signature_schedule
from kdsl.tune.metaschedule import tune_metaschedule
from kdsl.tune.opevo import OpEvo, RandomTuner, check_opevo_options, opevo_options
from kdsl.tune.records import Record, RecordStore, TuneError, Tuner, TuneResult, is_integer, open_task
from kdsl.tune.transfer import Prefiltered, pretrained, run_ranking

#: the tuners ``kdsl tune`` and ``kdsl bench tune`` offer (``random`` is the baseline besides them)
TUNERS = ("opevo", "alt", "gensor", "metaschedule")


def make_tuner(name: str, space: ScheduleSpace, history: Sequence[Record], seed: int = 0, **options: Any) -> Tuner:
    """A tuner by name (``opevo``, ``gensor``, ``alt``, ``random``) over ``space``, resuming from ``history``.

    >>> make_tuner("nope", None, [])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kdsl.tune.records.TuneError: unknown tuner 'nope'; choose one of alt, gensor, metaschedule, opevo, random
    """
    if name == "opevo":
        return OpEvo(space, history, seed=seed, **_known(OpEvo, name, opevo_options(options)))
    if name == "gensor":
        return Gensor(space, history, seed=seed, **_known(Gensor, name, options))
    if name == "alt":
        return Alt(space, history, seed=seed, **_known(Alt, name, options))
    if name == "random":
        return RandomTuner(space, history, seed=seed)
    raise TuneError(f"unknown tuner {name!r}; choose one of alt, gensor, metaschedule, opevo, random")


#: ``--tuner-option`` names that differ from the tuner's own argument: the papers' symbols, which the help
#: and every error use, each beside the argument it sets (``lambda=4`` and ``parents=4`` are the same option)
OPTION_ALIASES: dict[str, dict[str, str]] = {"opevo": {"lambda": "parents", "rho": "offspring"}}
#: ``--tuner-option`` names a tuner reads itself rather than passing on (OpEvo's ``setting=paper``)
_EXTRA_OPTIONS: dict[str, tuple[str, ...]] = {"opevo": ("setting",)}


def option_names(tuner: str) -> list[str]:
    """The ``--tuner-option`` names ``tuner`` takes, in the words the help uses (an alias beside its argument).

    >>> option_names("opevo")
    ['lambda (parents)', 'q', 'walks', 'explore', 'rho (offspring)', 'init', 'setting']
    >>> option_names("random")
    []
    """
    cls = {"opevo": OpEvo, "gensor": Gensor, "alt": Alt}.get(tuner)
    if cls is None:
        return []
    aliases = {argument: alias for alias, argument in OPTION_ALIASES.get(tuner, {}).items()}
    taken = [p for p in inspect.signature(cls).parameters if p not in ("space", "history", "seed", *_INTERNAL)]
    return [f"{aliases[p]} ({p})" if p in aliases else p for p in taken] + list(_EXTRA_OPTIONS.get(tuner, ()))


def check_options(tuner: str, options: Mapping[str, Any]) -> None:
    """Refuse ``options`` that ``tuner`` does not take, or values out of their range, before anything is
    compiled or measured.

    >>> check_options("opevo", {"lambda": 4, "q": 0.3, "setting": "paper"})
    >>> check_options("opevo", {"lambda": 4, "parents": 2})
    Traceback (most recent call last):
    ...
    kdsl.tune.records.TuneError: opevo: lambda and parents are the same option; give one
    >>> check_options("opevo", {"wings": 2})
    Traceback (most recent call last):
    ...
    kdsl.tune.records.TuneError: opevo has no option 'wings'; it takes lambda (parents), q, walks, explore, ...
    >>> check_options("gensor", {"steps": 0})
    Traceback (most recent call last):
    ...
    kdsl.tune.records.TuneError: gensor: steps must be a positive integer, got 0
    """
    if not options:
        return
    if tuner not in ("opevo", "gensor", "alt"):
        raise TuneError(f"{tuner} takes no tuner options (given {', '.join(options)})")
    if tuner == "opevo":  # its aliases, setting=paper and an option given twice (lambda and parents)
        values = _with_defaults(OpEvo, _known(OpEvo, tuner, opevo_options(options)))
        check_opevo_options(*(values[n] for n in ("parents", "q", "walks", "explore", "offspring", "init")))
    elif tuner == "alt":
        values = _with_defaults(Alt, _known(Alt, tuner, options))
        check_alt_options(
            *(values[n] for n in ("per_layout", "layouts", "q", "model", "min_records", "pool", "explore"))
        )
    else:
        values = _with_defaults(Gensor, _known(Gensor, tuner, options))
        # Gensor's counts: walks=0 would still walk twice (its starts are max(1, walks - 1) plus the heuristic)
        for option in ("walks", "steps", "constructions"):
            if not is_integer(values[option]) or values[option] < 1:
                raise TuneError(f"gensor: {option} must be a positive integer, got {values[option]!r}")


def _with_defaults(cls: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` over the keyword defaults of ``cls``'s constructor: the values a run would use."""
    parameters = inspect.signature(cls).parameters.values()
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    return {**defaults, **options}


def _known(cls: type, name: str, options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` if ``cls`` takes every one of them (``--tuner-option`` names), else a :class:`TuneError`
    listing what it takes (its internal ``fixed``, ``start``, ``seen`` are not offered)."""
    taken = [p for p in inspect.signature(cls).parameters if p not in ("space", "history", "seed", *_INTERNAL)]
    for option in options:
        if option not in taken:
            raise TuneError(f"{name} has no option {option!r}; it takes {', '.join(option_names(name))}")
    return options


def parse_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--tuner-option``: the value an int, a float, ``true``/``false``, ``none``, or text.

    >>> parse_option("q=0.3"), parse_option("lambda=4"), parse_option("model=false"), parse_option("init=random")
    (('q', 0.3), ('lambda', 4), ('model', False), ('init', 'random'))
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise TuneError(f"--tuner-option: expected KEY=VALUE (e.g. q=0.5), got {text!r}")
    value = value.strip()
    words = {"true": True, "false": False, "none": None}
    if value.lower() in words:
        return key.strip(), words[value.lower()]
    for kind in (int, float):
        try:
            return key.strip(), kind(value)
        except ValueError:
            pass
    return key.strip(), value


#: The tuners a pretrained cross-operator cost model ranks candidates for (gensor constructs its
#: schedules from its own analytic model; metaschedule has its own).
RANKED = ("opevo", "alt", "random")
#: Candidates drawn per configuration measured when the model ranks them.
PREFILTER = 4


#: Constructor arguments that tuners pass each other (ALT's inner OpEvo), not options for users.
_INTERNAL = ("fixed", "start", "seen")


def _sort_proposals(
    proposals: Sequence[Mapping[str, Any]],
    store: RecordStore,
    key: str,
    tuner: str,
    space: ScheduleSpace,
    block: int,
    log: Callable[[str], None] | None,
) -> tuple[list[dict[str, Any]], list[Record], list[float]]:
    """A batch of proposals as (configurations to measure, records of the ones not measured here: reused from
    another tuner or refused, the reused ones' latencies). A proposal of the tuner's own stored configuration
    is a tuner bug and raises."""
    fresh: list[dict[str, Any]] = []
    records: list[Record] = []
    reused: list[float] = []
    for config in proposals:
        config = normalize(config)
        ckey = config_key(config)
        if store.known(key, ckey, tuner):
            raise TuneError(f"tuner {tuner} proposed one of its stored configurations again")
        other = store.known(key, ckey)
        if other is not None:  # measured for another tuner: reuse, never measure twice
            records.append(Record(config, other.latency, other.error, tuner))
            if other.latency is not None:
                reused.append(other.latency)
            continue
        reason = _refusal(space, config, block)
        if reason is None:
            fresh.append(config)
        else:
            records.append(Record(config, None, reason, tuner))
            if log:
                log(f"{tuner}: proposed a configuration that does not apply: {reason.splitlines()[0]}")
    return fresh, records, reused


def _refusal(space: ScheduleSpace, config: Mapping[str, Any], block: int) -> str | None:
    """Why ``config`` cannot be measured, or None: the tuner's kept verdict (:meth:`ScheduleSpace.rejection`;
    a refusal here is a tuner's bug) and, for a channel-blocked signature, whether the blocked layout
    applies on top, which the tuners' check does not cover."""
    reason = space.rejection(config)
    if reason is None and block:
        try:
            signature_schedule(space, config, block)
        except LoweringError as error:
            return str(error)
    return reason


def tune(
    op: Operator,
    layer: Mapping[str, int],
    tuner: str = "opevo",
    trials: int = 64,
    db: str | os.PathLike[str] = "tune.db",
    *,
    batch: int = 8,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    measurer: Measurer | None = None,
    options: Mapping[str, Any] | None = None,
    confirm: int = 3,
    progress: Progress | None = None,
    cost_model_db: Sequence[str | os.PathLike[str]] = (),
    cost_model: bool = True,
    block: int = 0,
    prepacked: bool = False,
) -> TuneResult:
    """Tune ``op`` at ``layer`` with ``tuner`` for ``trials`` new measurements, storing every record in ``db``.

    Resumable: the records already in ``db`` for this task become the tuner's history and are never
    measured again. Configurations rejected before compiling (an invalid schedule) are recorded too but
    do not count as trials. At the end the ``confirm`` fastest configurations of this run are compiled again
    and timed twice more, a few seconds apart, and each keeps the fastest of its three timings: on these
    VMs a kernel runs up to 1.8x slower for seconds to minutes at a time (interference only ever slows a
    kernel down, so the fastest timing is the estimate), and a single timing decided the winner.
    ``tuner="metaschedule"`` runs TVM's MetaSchedule instead
    (:func:`kdsl.tune.metaschedule.tune_metaschedule`). ``progress`` (a :class:`kdsl.runtime.progress.Progress`)
    is set to the trials measured so far after each batch. The cost model, ``block`` and ``prepacked``: the
    module's text."""
    check_options(tuner, options or {})  # a misspelt option is refused before anything is compiled
    _check_cost_model_dbs(tuner, cost_model_db)
    _check_signature(tuner, measurer, block, prepacked)
    if tuner == "metaschedule":
        return tune_metaschedule(op, layer, trials, db, log=log, measurer=measurer, seed=seed)
    started = time.time()
    run_started = started
    binding, key, store = open_task(op, layer, db, block, prepacked)
    space = ScheduleSpace(lower(op, binding))
    history = store.records(key, tuner)  # the tuner resumes from its own records
    search = make_tuner(tuner, space, history, seed=seed, **dict(options or {}))
    search, model = _with_model(search, space, [db, *cost_model_db], store, key, seed) if cost_model else (search, None)
    own = measurer or Measurer(op, binding, block=block, prepacked=prepacked)
    best = min((r.latency for r in history if r.latency is not None), default=float("inf"))
    curve: list[float] = []
    measured = rejected = 0
    stalls = 0
    try:
        while measured < trials and stalls < 50:
            proposals = search.propose(min(batch, trials - measured))
            if not proposals:
                stalls += 1
                continue
            fresh, records, reused_times = _sort_proposals(proposals, store, key, tuner, space, block, log)
            for latency in reused_times:  # measured for another tuner: counted, never measured twice
                measured += 1
                best = min(best, latency)
                curve.append(best)
            reused = len(reused_times)
            rejected += len(records) - reused
            stalls = stalls + 1 if not fresh and not reused else 0
            for config, (latency, error) in zip(fresh, own.measure(space, fresh)):
                records.append(Record(config, latency, error, tuner))
                measured += 1
                if latency is not None:
                    best = min(best, latency)
                curve.append(best)
            for record in records:
                store.add(key, record)
            search.update(records)
            if progress is not None:
                progress.set(measured, rejected=rejected, best=duration(best))
            if log:
                log(
                    f"{tuner}: {measured}/{trials} measured, {rejected} rejected ({_refused(space)} refused in all), "
                    f"best {duration(best)} (compile {own.compile_seconds:.0f} s, measure {own.measure_seconds:.0f} s, "
                    f"{time.time() - started:.0f} s in all)"
                )
            if rejected > 20 * max(trials, 1):
                break
        if confirm > 0:
            _confirm(store, key, tuner, space, own, run_started, confirm, log)
    finally:
        if measurer is None:
            own.close()
    best_record, seconds = store.best(key, tuner), time.time() - started
    result = TuneResult(key, tuner, best_record, curve, measured, rejected, seconds, refused=_refused(space))
    return _with_ranking(result, model, space, store, run_started, log)


def _check_signature(tuner: str, measurer: Measurer | None, block: int, prepacked: bool = False) -> None:
    """Refuse a channel-blocked or prepacked task that MetaSchedule would tune, or a measurer of another
    signature."""
    if (block or prepacked) and tuner == "metaschedule":
        which = "channel-blocked" if block else "prepacked-weights"
        raise TuneError(
            f"metaschedule tunes its own module in the plain signature; tune a {which} one with opevo, alt or gensor"
        )
    given = getattr(measurer, "block", 0)
    if measurer is not None and given != block:  # its timings would be of another signature
        raise TuneError(f"the measurer given measures channel block {given}, the task's is {block}")
    packs = getattr(measurer, "prepacked", False)
    if measurer is not None and packs != prepacked:
        raise TuneError(
            f"the measurer given measures prepacked={packs} (weights packed once), the task's is prepacked={prepacked}"
        )


def _check_cost_model_dbs(tuner: str, paths: Sequence[str | os.PathLike[str]]) -> None:
    """Refuse a ``--cost-model-db`` that is not there, or one given to a tuner that never uses it."""
    for path in paths:
        if not Path(path).is_file():
            raise TuneError(f"--cost-model-db: no records database at {str(path)!r}")
    if paths and tuner == "metaschedule":
        raise TuneError("metaschedule ranks with its own cost model; --cost-model-db is for opevo, alt, random")


def _refused(space: ScheduleSpace) -> int:
    """Distinct candidates the space refused this run: the tuners' checks before proposing (OpEvo's children,
    random draws, ALT's, Gensor's and the cost model's candidates) and the driver's of each proposal."""
    return sum(reason is not None for reason in space.verdicts.values())


def _with_model(
    search: Tuner, space: ScheduleSpace, paths: Sequence[Any], store: RecordStore, task: str, seed: int
) -> tuple[Tuner, Any]:
    """The tuner behind the cross-operator cost model trained on the other tasks of this target in
    ``paths`` (opevo, alt and random; the others unchanged), and the model (None: too few tasks)."""
    model = pretrained(paths, store_target(store, task), task, seed)
    if model is not None and search.name in RANKED:  # the model ranks candidates before they are measured
        search = Prefiltered(search, space, model, PREFILTER)
    return search, model


def _with_ranking(
    result: TuneResult,
    model: Any,
    space: ScheduleSpace,
    store: RecordStore,
    since: float,
    log: Callable[[str], None] | None,
) -> TuneResult:
    """``result`` with the model's held-out :class:`~kdsl.tune.transfer.Ranking` on the configurations
    this run measured (logged as one line)."""
    if model is not None:
        records = [r for r in store.records(result.task, result.tuner) if r.at >= since]
        result.ranking = run_ranking(model, space, records)
        if log and result.ranking is not None:
            log(result.ranking.line())
    return result


def store_target(store: RecordStore, task: str) -> str:
    """The target (mcpu) ``task`` was described with in ``store``."""
    return str(store.descriptions().get(task, {}).get("target", ""))


def _confirm(
    store: RecordStore,
    task: str,
    tuner: str,
    space: ScheduleSpace,
    measurer: Measurer,
    since: float,
    count: int,
    log: Callable[[str], None] | None,
) -> None:
    """Re-time the ``count`` fastest records of this run twice (fresh compiles, in alternation) and store
    the fastest of each one's three timings."""
    fresh = [r for r in store.records(task, tuner) if r.latency is not None and r.at >= since]
    top = sorted(fresh, key=lambda r: r.latency or 0.0)[:count]
    if len(top) < 2:
        return
    timings = {r.key: [r.latency or 0.0] for r in top}
    built = measurer.compile([r.config for r in top])
    for _ in range(2):
        for record, (path, _) in zip(top, built):
            if path is not None:
                latency, _ = measurer.time_library(path, check=False)
                if latency is not None:
                    timings[record.key].append(latency)
    fastest = {}
    for record, (path, _) in zip(top, built):
        fastest[record.key] = min(timings[record.key])
        store.confirm(task, record.key, tuner, fastest[record.key])
        if path is not None:
            Path(path).unlink(missing_ok=True)
    if log:
        log(f"{tuner}: re-timed the {len(top)} fastest; best {duration(min(fastest.values()))}")

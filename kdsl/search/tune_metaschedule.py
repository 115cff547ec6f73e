"""The baseline: TVM's MetaSchedule (``tvm.s_tir.meta_schedule.tune_tir``) on the same TE program.

The operator's ``create_prim_func`` module is tuned with MetaSchedule's evolutionary search and XGBoost
cost model, with the builder of ``TVM.md`` (the default one imports ``tvm.s_tir.tensor_intrin`` in every
worker, 35 s, and half its builds time out). MetaSchedule keeps its own JSON database in a folder next to
the records database (``<db>.ms/<task>``), so a second run continues from it. Its reported run times are
optimistic: its best schedule is compiled and re-measured by kdsl's :class:`~kdsl.search.tune.Measurer`
in a fresh process, and that latency (with the output checked against the reference) is the result.

Records: each MetaSchedule trial is stored with tuner ``metaschedule:reported`` (its own time), the
re-measured best with tuner ``metaschedule``; configurations are ``{"trace": <the schedule's trace>}``.

>>> cpu_build.__name__
'cpu_build'
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kdsl.lang.build import Operator
from kdsl.search.tune import Measurer, Record, RecordStore, TuneResult, _lowered, compile_module, task_key


def cpu_build(mod: Any, target: Any, _params: Any) -> Any:
    """MetaSchedule's default CPU builder without its 35 s ``tensor_intrin`` import (``TVM.md``)."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm.driver.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def tune_metaschedule(
    op: Operator,
    layer: Mapping[str, int],
    trials: int,
    db: str | os.PathLike[str],
    *,
    log: Callable[[str], None] | None = None,
    measurer: Measurer | None = None,
    seed: int = 0,
) -> TuneResult:
    """Run MetaSchedule for ``trials`` trials, store its records, and re-measure its best schedule."""
    from tvm.s_tir import meta_schedule as ms

    from kdsl import solve
    from kdsl.codegen.tvm import default_target

    started = time.time()
    binding = solve.bind(op, layer)
    target = default_target()
    key = task_key(op, binding, str(target.attrs.get("mcpu", "")))
    store = RecordStore(db)
    store.describe(key, {"op": op.key, "binding": binding, "target": str(target.attrs.get("mcpu", ""))})
    module = _lowered(op, binding).module()
    work_dir = Path(f"{db}.ms") / key
    work_dir.mkdir(parents=True, exist_ok=True)
    before = len(ms.database.JSONDatabase(work_dir=str(work_dir)).get_all_tuning_records())
    database = ms.tune_tir(
        module,
        target,
        work_dir=str(work_dir),
        max_trials_global=before + trials,
        num_trials_per_iter=min(32, trials),
        builder=ms.builder.LocalBuilder(f_build=cpu_build, timeout_sec=60),
        seed=seed,
    )
    records = database.get_all_tuning_records()
    curve: list[float] = []
    best = float("inf")
    for record in records[before:]:
        secs = [float(s) for s in (record.run_secs or [])]
        latency = sorted(secs)[len(secs) // 2] if secs and min(secs) < 1e9 else None
        store.add(
            key, Record({"trace": str(record.trace)}, latency, None if latency else "failed", "metaschedule:reported")
        )
        if latency is not None:
            best = min(best, latency)
        curve.append(best)
    if log:
        log(f"metaschedule: {len(records) - before} trials, reported best {best * 1e3:.3f} ms, re-measuring")
    sch = ms.tir_integration.compile_tir(database, module, target)
    result: Record | None = None
    if sch is not None:
        own = measurer or Measurer(op, binding)
        try:
            path = str(work_dir / "best.so")
            compile_module(sch.mod, path)
            latency, error = own.time_library(path, check=True)
        finally:
            if measurer is None:
                own.close()
        result = Record({"trace": str(sch.trace), "remeasured": True}, latency, error, "metaschedule")
        store.add(key, result)
        if log:
            log(f"metaschedule: re-measured best {latency * 1e3 if latency else float('nan'):.3f} ms")
    library = str(work_dir / "best.so") if sch is not None else None
    return TuneResult(key, "metaschedule", result, curve, len(records) - before, 0, time.time() - started, library)

"""Schedule tuning: one driver and records store, OpEvo, Gensor-style construction, ALT and MetaSchedule.

:func:`apply` turns a tuning run's best record into a compiled kernel (``kdsl.tune.apply("tune.db", op,
layer)``), :func:`export` into a shared library; neither loads tvm before it is called."""

from kdsl.tune.tuned import apply, best_record, export, schedule_lines

__all__ = ["apply", "best_record", "export", "schedule_lines"]

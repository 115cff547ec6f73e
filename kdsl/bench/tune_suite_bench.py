"""``kdsl bench tune --suite opevo|alt|gensor|all``: the seed papers' benchmark suites, several runs each.

For every case of the suite (:mod:`kdsl.bench.tune_suites`) and every run, each tuner tunes the case
from a fresh records database (seed = the run's index) with its budget: ``--trials`` for kdsl's
tuners, each of ``--metaschedule-trials`` (64 and 256 by default) for MetaSchedule, a column each.
Then every tuner's best schedule and the default schedule are recompiled and re-measured in one
measuring process, in alternation with PyTorch's native op (:func:`kdsl.codegen.native.native_function`)
timed in a worker process of its own, for ``--rounds`` rounds, each keeping its best median (as plain
``kdsl bench tune`` does). Over the runs: the mean ± std of each tuner's best latency and of its
speed ratio to PyTorch. Into ``--out``: ``results.md`` (the tables, and the cases that are not
expressible yet with the reason), ``curves.csv`` (best-so-far after each trial, every run) and one
``<suite>-<case>.png`` of the curves per case (when matplotlib is installed).

Without ``--suite``, ``kdsl bench tune`` is :func:`kdsl.bench.tune_bench.bench_tune`, unchanged.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kdsl import gallery, solve
from kdsl.bench import target as bench_target
from kdsl.bench import tune_bench
from kdsl.bench.argument_types import positive_int
from kdsl.bench.peak_cache import roofline_for
from kdsl.bench.roofline import MARGIN, Roofline, minimum_bytes, program_macs, within_margin
from kdsl.bench.tune_suites import SuiteCase, baseline_reason, blocked_reason, suite_cases, suite_names, suite_of
from kdsl.codegen import reference
from kdsl.codegen.native import native_function
from kdsl.codegen.tvm import lower
from kdsl.codegen.tvm.default_schedule import default_schedule
from kdsl.codegen.tvm.machine import current_machine
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.lang.errors import KdslError
from kdsl.runtime.timing import median_seconds
from kdsl.runtime.workers import Slot, WorkerPool
from kdsl.tune.driver import tune
from kdsl.tune.measurer import Measurer, compile_module


def budgets(text: str) -> list[int]:
    """argparse type of ``--metaschedule-trials``: comma-separated positive trial counts.

    >>> budgets("64,256")
    [64, 256]
    >>> budgets("64,x")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected positive trial counts separated by commas (e.g. 64,256), got '64,x'
    """
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive trial counts separated by commas (e.g. 64,256), got {text!r}"
        )
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kdsl bench tune``: :func:`kdsl.bench.tune_bench.add_arguments` and the suites'."""
    tune_bench.add_arguments(parser)
    parser.add_argument("--suite", default=None, help=f"a papers' benchmark suite: {', '.join(suite_names())}")
    parser.add_argument("--only", nargs="+", default=None, metavar="LABEL", help="with --suite: only these cases")
    parser.add_argument("--runs", type=positive_int, default=3, help="with --suite: runs per tuner (mean ± std)")
    parser.add_argument(
        "--metaschedule-trials",
        type=budgets,
        default=[64, 256],
        help="with --suite: MetaSchedule's budgets, one column each (default 64,256)",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="with --suite: folder of results.md, curves (default kdsl-tune-SUITE)",
    )
    parser.add_argument(
        "--remeasure-peak",
        action="store_true",
        help="with --suite: measure the roofline's peak now, not from the cache (kdsl.bench.peak_cache)",
    )


def bench_tune(args: argparse.Namespace) -> int:
    """``kdsl bench tune``: the suite of ``--suite``, else the plain bench (:mod:`kdsl.bench.tune_bench`)."""
    if getattr(args, "suite", None) is None:
        # the suites' own options mean nothing to the plain bench: refuse them rather than run without them
        remeasure = getattr(args, "remeasure_peak", False) or None
        options = (("--only", args.only), ("--out", args.out), ("--remeasure-peak", remeasure))
        given = [flag for flag, value in options if value is not None]
        if given:
            raise KdslError(f"{' and '.join(given)}: options of a suite (its cases, folder, peak): add --suite NAME")
        return tune_bench.bench_tune(args)
    return bench_suite(args)


# ------------------------------------------------------------------------------------------------
# PyTorch's baseline, in a worker process of its own (TVM's pinned threads would slow it down)


def _native_job(
    state: None, job: tuple[str, list[tuple[int, ...]], list[tuple[int, ...]], dict[str, int]], slot: Slot
) -> float:
    """One median of PyTorch's native op on random inputs of the kernel's shapes, in the latency slot."""
    import torch

    name, input_shapes, weight_shapes, sizes = job
    inputs = [torch.randn(shape) for shape in input_shapes]
    weights = [torch.randn(shape) for shape in weight_shapes]
    function = native_function(name, inputs[0] if len(inputs) == 1 else tuple(inputs), weights, sizes)
    with torch.no_grad(), slot():
        return median_seconds(function, repeats=5, target=0.04, warmup=3)


def native_pool() -> WorkerPool:
    """The PyTorch worker: :func:`kdsl.bench.tune_bench.torch_pool` timing :func:`_native_job`."""
    return tune_bench.torch_pool(_native_job)


def native_job(
    name: str, binding: Mapping[str, int]
) -> tuple[str, list[tuple[int, ...]], list[tuple[int, ...]], dict[str, int]]:
    """The job of :func:`_native_job` for the gallery operator ``name`` at ``binding``."""
    shapes = reference.shapes(gallery.load(name), binding)
    return name, [tuple(s) for s in shapes.inputs], [tuple(s) for s in shapes.weights], dict(binding)


# ------------------------------------------------------------------------------------------------
# One case: runs of every column, then the statistics


@dataclass
class Column:
    """One column of a case's table: a tuner with its trial budget (``metaschedule@64``)."""

    name: str
    tuner: str
    trials: int


@dataclass
class CaseResult:
    """Every run of one case: per column the re-measured best seconds (``None``: no valid schedule),
    its best-so-far curve and tuning seconds; PyTorch's seconds per run; the errors seen."""

    case: SuiteCase
    macs: float = 0.0
    nbytes: float = 0.0  # the least bytes any kernel moves (kdsl.bench.roofline.minimum_bytes)
    latencies: dict[str, list[float | None]] = field(default_factory=dict)
    curves: dict[str, list[list[float]]] = field(default_factory=dict)
    tuning: dict[str, list[float]] = field(default_factory=dict)
    torch: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def columns(tuners: Sequence[str], trials: int, metaschedule_trials: Sequence[int]) -> list[Column]:
    """The columns: each tuner at ``trials``, MetaSchedule once per budget.

    >>> [c.name for c in columns(["opevo", "metaschedule"], 64, [64, 256])]
    ['opevo', 'metaschedule@64', 'metaschedule@256']
    """
    out = []
    for tuner in tuners:
        if tuner == "metaschedule":
            out += [Column(f"metaschedule@{n}", tuner, n) for n in metaschedule_trials]
        else:
            out.append(Column(tuner, tuner, trials))
    return out


def _slug(case: SuiteCase) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", f"{suite_of(case)}-{case.label}").strip("-").lower()


def _records_path(folder: Path, case: SuiteCase, run: int, col: Column) -> Path:
    """The records database of ``col``'s tuning in run ``run`` of ``case`` under ``--out`` ``folder``."""
    return folder / "records" / f"{_slug(case)}-run{run}-{col.name.replace('@', '-')}.db"


def left_records(folder: Path, cases: Sequence[SuiteCase], runs: int, cols: Sequence[Column]) -> list[Path]:
    """The records databases under ``folder`` that a suite of ``cases`` x ``runs`` x ``cols`` would tune
    into and that already exist (MetaSchedule's work folder ``<db>.ms`` counts): a run must start from
    fresh ones, and a tuner given an old database continues from it (MetaSchedule warm-starts from its
    records), so its column would hold more trials than its budget.

    >>> left_records(Path("/nonexistent"), suite_cases("smoke"), 1, columns(["opevo"], 2, []))
    []
    """
    paths = (_records_path(folder, case, run, col) for case in cases for run in range(runs) for col in cols)
    return [p for p in paths if p.exists() or Path(f"{p}.ms").exists()]


def _one_run(case: SuiteCase, cols: Sequence[Column], run: int, folder: Path, rounds: int, result: CaseResult) -> None:
    """Tune every column once (fresh databases, seed ``run``), then re-measure the bests and PyTorch."""
    op = gallery.load(case.operator)
    binding = solve.bind(op, case.layer)
    has_baseline = baseline_reason(case) is None
    libraries: dict[str, str] = {}
    with Measurer(op, binding) as measurer, native_pool() as torch_worker:
        space: ScheduleSpace | None = None
        for col in cols:
            db = _records_path(folder, case, run, col)
            log = functools.partial(print, f"  [{case.label} run {run + 1}]", file=sys.stderr)
            try:
                outcome = tune(op, binding, col.tuner, col.trials, str(db), seed=run, measurer=measurer, log=log)
            except KdslError as error:
                result.errors.append(f"{col.name}, run {run + 1}: {error}")
                continue
            result.curves.setdefault(col.name, []).append(list(outcome.curve))
            result.tuning.setdefault(col.name, []).append(outcome.seconds)
            if col.tuner == "metaschedule":
                if outcome.library:
                    libraries[col.name] = outcome.library
            elif outcome.best is not None and outcome.best.latency is not None:
                space = space or ScheduleSpace(lower(op, binding))
                path = str(folder / "records" / f"{_slug(case)}-run{run}-{col.name}.so")
                compile_module(space.apply(outcome.best.config).mod, path)
                libraries[col.name] = path
        path = str(folder / "records" / f"{_slug(case)}-run{run}-default.so")
        compile_module(default_schedule(lower(op, binding)).mod, path)
        libraries["default schedule"] = path
        final, torch_s = _remeasure(measurer, libraries, rounds, torch_worker if has_baseline else None, case, binding)
    for name in [c.name for c in cols] + ["default schedule"]:
        result.latencies.setdefault(name, []).append(final.get(name))
    if torch_s is not None:
        result.torch.append(torch_s)


def _remeasure(
    measurer: Measurer,
    libraries: Mapping[str, str],
    rounds: int,
    torch_worker: WorkerPool | None,
    case: SuiteCase,
    binding: Mapping[str, int],
) -> tuple[dict[str, float], float | None]:
    """Each library's and PyTorch's best median over ``rounds`` rounds in alternation
    (:func:`kdsl.bench.tune_bench.remeasure`); no PyTorch time without a worker."""
    time_torch = None
    if torch_worker is not None:
        job = native_job(case.operator, binding)

        def time_torch() -> float:
            outcome = torch_worker.call(job)
            if not outcome.ok:
                raise KdslError(f"timing PyTorch's {case.operator} failed: {outcome.error}")
            return outcome.value

    def failed(name: str, error: str) -> None:
        print(f"  {case.label} {name}: re-measurement failed: {error}", file=sys.stderr)

    final, torch_s = tune_bench.remeasure(measurer, libraries, rounds, time_torch, failed)
    return final, (torch_s if torch_worker is not None else None)


def mean_std(values: Sequence[float], scale: float = 1.0, digits: int = 3) -> str:
    """``mean ± std`` of ``values`` times ``scale`` (the std of one value is 0), ``-`` when empty.

    >>> mean_std([1.0, 2.0, 3.0]), mean_std([0.5], 1e3, 1), mean_std([])
    ('2.000 ± 1.000', '500.0 ± 0.0', '-')
    """
    if not values:
        return "-"
    mean = statistics.fmean(values) * scale
    std = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def case_table(result: CaseResult, cols: Sequence[Column]) -> list[str]:
    """The Markdown lines of one case: PyTorch, then every column and the default schedule."""
    case = result.case
    lines = [
        f"### {suite_of(case)} {case.label}: {case.operator} at {dict(case.layer)} ({case.paper}; "
        f"{result.macs / 1e9:.3f} GMAC)",
        "",
        "| schedule | trials | best ms (mean ± std) | vs PyTorch, speed (mean ± std) | valid runs | tuning s (mean) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    torch_text = mean_std(result.torch, 1e3) if result.torch else f"not expressible yet: {baseline_reason(case)}"
    lines.append(f"| PyTorch | - | {torch_text} | 1 | {len(result.torch)} | - |")
    torch_mean = statistics.fmean(result.torch) if result.torch else None
    for name, trials in [(c.name, str(c.trials)) for c in cols] + [("default schedule", "-")]:
        runs = result.latencies.get(name, [])
        valid = [v for v in runs if v is not None]
        # the ratio of each run to that run's own PyTorch time, when both exist
        ratios = [t / v for t, v in zip(result.torch, runs) if v is not None] if torch_mean else []
        spent = result.tuning.get(name)
        tuning = f"{statistics.fmean(spent):.0f}" if spent else "-"
        lines.append(
            f"| {name} | {trials} | {mean_std(valid, 1e3)} | {mean_std(ratios, 1.0, 2)} | "
            f"{len(valid)}/{len(runs)} | {tuning} |"
        )
    lines += ["", *(f"- error: {e}" for e in result.errors)]
    return lines


def _mean_latency(result: CaseResult, name: str) -> float | None:
    """The mean of ``name``'s valid re-measured latencies over the runs, ``None`` without one."""
    valid = [v for v in result.latencies.get(name, []) if v is not None]
    return statistics.fmean(valid) if valid else None


def roofline_table(results: Sequence[CaseResult], cols: Sequence[Column], roofline: Roofline) -> list[str]:
    """The Markdown lines of the roofline section: per case its bound (:mod:`kdsl.bench.roofline`),
    the default schedule's and the best column's share of it (bound / mean time), and how many
    defaults are within 10% of their bound, where no tuner can gain 1.1x (the ceilings are in the
    header's :meth:`~kdsl.bench.roofline.Roofline.line`). Where a kernel of the run, PyTorch's included,
    computed faster than the measured FMA peak allows, the bound takes its rate
    (:meth:`~kdsl.bench.roofline.Roofline.raised_to`) and the section says so."""
    roofline, raised = roofline.raised_to(_compute_rates(results, cols))
    lines = [
        "## Roofline",
        "",
        *([f"{raised[0].upper()}{raised[1:]}.", ""] if raised else []),
        "| case | GMAC | min MiB | bound | roofline ms | default ms | default vs roofline | best | best ms | "
        "best vs roofline |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    close = measured = above = 0
    for result in results:
        bound = roofline.bound(result.macs, result.nbytes)
        default = _mean_latency(result, "default schedule")
        means = {c.name: _mean_latency(result, c.name) for c in cols}
        best_name = min((n for n, v in means.items() if v is not None), key=lambda n: means[n], default=None)
        best = means[best_name] if best_name is not None else None
        if default is not None:
            measured += 1
            close += within_margin(bound.share(default))
            above += bound.share(default) > 1.0
        lines.append(
            f"| {suite_of(result.case)} {result.case.label} | {result.macs / 1e9:.3f} | {result.nbytes / 2**20:.2f} | "
            f"{bound.limit} | {bound.seconds * 1e3:.3f} | {_ms(default)} | {_share(bound.share, default)} | "
            f"{best_name or '-'} | {_ms(best)} | {_share(bound.share, best)} |"
        )
    lines += [
        "",
        f"The default schedule is within {MARGIN:.0%} of its roofline (its time at most {1 + MARGIN:.1f}x the bound) "
        f"on {close} of {measured} cases: no tuner can make those {1 + MARGIN:.1f}x faster.",
        *(
            [f"{above} of them exceed their bound: the peak or bandwidth measured low (a busy machine?)."]
            if above
            else []
        ),
        "Bound: max(2 x MACs / FMA peak, min bytes / read bandwidth); min bytes: every input and weight read once "
        "and the output written once (fp32); vs roofline: bound / mean time (1 = at the machine's bound).",
    ]
    return lines


def _compute_rates(results: Sequence[CaseResult], cols: Sequence[Column]) -> dict[str, float]:
    """GFLOP/s (2 per MAC) of every kernel's mean time in ``results``, keyed by who ran it on which case."""
    rates = {}
    for result in results:
        name = f"{suite_of(result.case)} {result.case.label}"
        means = {"PyTorch": statistics.fmean(result.torch) if result.torch else None}
        means |= {c: _mean_latency(result, c) for c in ("default schedule", *(col.name for col in cols))}
        for who, seconds in means.items():
            if seconds is not None and seconds > 0 and result.macs > 0:
                rates[f"{who} on {name}"] = 2.0 * result.macs / seconds / 1e9
    return rates


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f}" if seconds is not None else "-"


def _share(share: Callable[[float], float], seconds: float | None) -> str:
    return f"{share(seconds):.2f}" if seconds is not None else "-"


# ------------------------------------------------------------------------------------------------
# Output files


def write_curves_csv(path: Path, results: Sequence[CaseResult]) -> None:
    """Every best-so-far curve as rows ``suite, case, column, run, trial, best_ms`` (empty: none yet)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["suite", "case", "column", "run", "trial", "best_ms"])
        for result in results:
            for name, runs in result.curves.items():
                for run, curve in enumerate(runs):
                    for trial, seconds in enumerate(curve, 1):
                        best = "" if seconds == float("inf") else f"{seconds * 1e3:.6f}"
                        writer.writerow([suite_of(result.case), result.case.label, name, run + 1, trial, best])


def plot_curves(path: Path, result: CaseResult) -> bool:
    """A PNG of one case's best-so-far curves (mean over the runs, min-max band; PyTorch dashed);
    ``False`` when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, runs in result.curves.items():
        length = max((len(c) for c in runs), default=0)
        if not length:
            continue
        points = []
        for trial in range(length):
            values = [c[min(trial, len(c) - 1)] * 1e3 for c in runs if c and c[min(trial, len(c) - 1)] != float("inf")]
            if values:
                points.append((trial + 1, statistics.fmean(values), min(values), max(values)))
        if points:
            xs, mean, low, high = zip(*points)
            (line,) = axes.plot(xs, mean, label=name)
            axes.fill_between(xs, low, high, alpha=0.2, color=line.get_color())
    if result.torch:
        axes.axhline(statistics.fmean(result.torch) * 1e3, linestyle="--", color="black", label="PyTorch")
    axes.set_yscale("log")  # tuners and baselines can be orders of magnitude apart
    axes.set_xlabel("trial")
    axes.set_ylabel("best latency so far (ms)")
    axes.set_title(f"{suite_of(result.case)} {result.case.label}: {result.case.operator}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def _labels(cases: Sequence[SuiteCase]) -> str:
    """The labels of ``cases``, suite by suite where they come from several (``all``: Gensor's C1 is
    not OpEvo's, and ``--only C1`` takes both).

    >>> _labels(suite_cases("smoke"))
    'MM-tiny'
    >>> _labels(suite_cases("all")).split("; ")[2][:20]
    'gensor: M1, M2, M3, '
    """
    by_suite: dict[str, list[str]] = {}
    for case in cases:
        by_suite.setdefault(suite_of(case), []).append(case.label)
    if len(by_suite) == 1:
        return ", ".join(next(iter(by_suite.values())))
    return "; ".join(f"{suite}: {', '.join(labels)}" for suite, labels in by_suite.items())


def bench_suite(args: argparse.Namespace) -> int:
    """Run the suite of ``args.suite``: tables on stdout and, in ``args.out``, results.md, curves.csv, PNGs."""
    cases = suite_cases(args.suite)  # an unknown name: a KdslError listing the suites
    if args.only:
        unknown = sorted(set(args.only) - {c.label for c in cases})
        if unknown:
            raise KdslError(f"--only: no case {', '.join(unknown)} in the suite {args.suite}; it has {_labels(cases)}")
        cases = [c for c in cases if c.label in args.only]
    if args.db:
        raise KdslError("--db is not used with --suite: every run starts from fresh databases under --out")
    bench_target.select_mcpu(args.mcpu)  # before anything compiles or a worker starts
    trials, rounds = tune_bench.budgets(args)
    cols = columns(args.tuners, trials, args.metaschedule_trials)
    folder = Path(args.out or f"kdsl-tune-{args.suite}")
    left = left_records(folder, [c for c in cases if blocked_reason(c) is None], args.runs, cols)
    if left:  # refused before any work, and nothing of the earlier run is deleted
        shown = ", ".join(str(p) for p in left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        raise KdslError(
            f"--out {folder} holds records of an earlier run ({shown}): every run of a suite tunes from fresh "
            "databases (a tuner would continue from these, past its budget); give a new --out or remove them"
        )
    (folder / "records").mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    machine = current_machine()
    # once per suite, before any worker starts: a few seconds where the cache has none a week old at most
    roofline, source = roofline_for(machine, remeasure=getattr(args, "remeasure_peak", False))
    metaschedule = ""
    if "metaschedule" in args.tuners:
        metaschedule = f", MetaSchedule at {', '.join(map(str, args.metaschedule_trials))}"
    header = [
        f"# kdsl bench tune --suite {args.suite}",
        "",
        f"{args.runs} runs; {trials} trials per kdsl tuner{metaschedule}; {rounds} re-measurement rounds; "
        f"load average {load:.2f} at start.",
        bench_target.machine_line(machine),
        f"{roofline.line()} ({source})",
        "",
    ]
    print("\n".join(header), flush=True)
    results, blocked = [], []
    started = time.time()
    for case in cases:
        reason = blocked_reason(case)
        if reason:
            blocked.append(
                f"- {suite_of(case)} {case.label} ({case.operator}, {case.paper}): not expressible yet: {reason}"
            )
            print(blocked[-1], flush=True)
            continue
        op = gallery.load(case.operator)
        binding = solve.bind(op, case.layer)
        result = CaseResult(case, macs=float(program_macs(op, binding)), nbytes=minimum_bytes(op, binding))
        for run in range(args.runs):
            _one_run(case, cols, run, folder, rounds, result)
        results.append(result)
        print("\n".join(case_table(result, cols)), flush=True)
    plotted = [f"{_slug(r.case)}.png" for r in results if plot_curves(folder / f"{_slug(r.case)}.png", r)]
    write_curves_csv(folder / "curves.csv", results)
    body = [line for r in results for line in case_table(r, cols)]
    body += roofline_table(results, cols, roofline) if results else []
    notes = [
        "",
        "Best ms: each run's best schedule recompiled and re-measured in one process, alternating with PyTorch, "
        "best median over the rounds; the ratio is PyTorch's time over the schedule's, run by run. "
        "MetaSchedule's curves are its own reported times (optimistic).",
        f"Curves: curves.csv; plots: {', '.join(plotted) if plotted else 'none (matplotlib is not installed)'}.",
        f"{time.time() - started:.0f} s in all.",
    ]
    if blocked:
        notes += ["", "## Not expressible yet", "", *blocked]
    (folder / "results.md").write_text("\n".join(header + body + notes) + "\n", encoding="utf-8")
    print("\n".join((roofline_table(results, cols, roofline) if results else []) + notes[1:]), flush=True)
    print(f"(written to {folder})")
    return 0

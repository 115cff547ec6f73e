"""The one timing helper of kdsl and the machine's latency slot: one measurement at a time per machine.

Two measurements that overlap on one machine slow each other down, so every latency measurement
holds :func:`latency_slot`, an exclusive ``fcntl.flock`` on a lock file shared by every process of
the machine (local workers, Ray workers, other kdsl runs). The operating system drops the lock when
its holder dies, so a worker killed for a timeout never leaves the slot taken.

:func:`interleaved_medians` times several functions in alternation (a, b, a, b, ...), so that
machine noise (frequency changes, a noisy neighbour) hits all of them alike, and returns the median
seconds per call of each. The order changes from round to round (:func:`round_order`), so no
function always runs right after the same one: a kernel timed just after PyTorch's parallel call
measured about 15% slower at 2 threads while PyTorch's OpenMP threads still spun, and a fixed order
put that cost on one member every round; :func:`median_seconds` is the same for one function.
:func:`interleaved_samples` returns every round's times instead, and :func:`ratio_of_pairs` turns
two functions' rounds into one ratio: the median over rounds of the ratio *within* a round. A
slow spell of the machine that lasts a round or two then scales both members of those pairs and
leaves their ratios alone, where it moves each function's median separately (and their ratio). Everything in kdsl
that times a Python callable uses them (the latency evaluator, ``kdsl bench``); compiled TVM kernels
in the tuner's measuring worker are timed by TVM's own ``time_evaluator``, inside the slot too.
Isolated worker processes with hard timeouts are in :mod:`kdsl.runtime.workers`.

>>> with latency_slot():
...     seconds = interleaved_medians([lambda: sum(range(100)), lambda: sum(range(10))], repeats=3, target=0.001)
>>> len(seconds), all(s > 0 for s in seconds)
(2, True)
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from statistics import median
from typing import Any

__all__ = [
    "LOCK_ENV",
    "interleaved_medians",
    "interleaved_samples",
    "latency_lock_path",
    "latency_slot",
    "median_seconds",
    "round_order",
    "ratio_of_pairs",
    "ratio_spread",
]

#: Environment variable naming the lock file (default: ``kdsl-latency.lock`` in the temp folder).
LOCK_ENV = "KDSL_LATENCY_LOCK"


def latency_lock_path() -> Path:
    """The machine-wide lock file that serializes latency measurements.

    >>> latency_lock_path().name
    'kdsl-latency.lock'
    """
    configured = os.environ.get(LOCK_ENV)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / "kdsl-latency.lock"


@contextlib.contextmanager
def latency_slot(path: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Hold the machine's latency slot (an exclusive ``flock``) for the duration of the block.

    Blocks while another process of the machine measures. Without ``fcntl`` (Windows) it does not
    lock: measurements may then overlap.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    lock_path = Path(path) if path is not None else latency_lock_path()
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _calls_for(function: Callable[[], Any], target: float, warmup: int) -> int:
    """How many calls take about ``target`` seconds (after ``warmup`` untimed calls)."""
    for _ in range(warmup):
        function()
    start = time.perf_counter()
    function()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(10_000, int(target / once)))


def interleaved_medians(
    functions: Sequence[Callable[[], Any]],
    *,
    repeats: int = 7,
    target: float = 0.02,
    number: int | None = None,
    warmup: int = 1,
) -> list[float]:
    """Median seconds per call of each function, timed in alternation.

    Each function is called ``warmup`` times untimed and given a call count that takes about
    ``target`` seconds (or exactly ``number`` calls); then ``repeats`` rounds each time every
    function once (in order), and the median over rounds is returned per function. It does not take
    the latency slot: the caller holds it around everything it measures together.

    >>> fast, slow = interleaved_medians([lambda: None, lambda: time.sleep(0.002)], repeats=3, target=0.004)
    >>> fast < slow
    True
    """
    samples = interleaved_samples(functions, repeats=repeats, target=target, number=number, warmup=warmup)
    return [median(each) for each in samples]


def interleaved_samples(
    functions: Sequence[Callable[[], Any]],
    *,
    repeats: int = 7,
    target: float = 0.02,
    number: int | None = None,
    warmup: int = 1,
) -> list[list[float]]:
    """Seconds per call of each function in each round, timed in alternation as
    :func:`interleaved_medians` times them: ``samples[f][r]`` is function ``f`` in round ``r``
    (so ``samples[0][r]`` and ``samples[1][r]`` are a pair timed back to back).

    >>> rounds = interleaved_samples([lambda: None, lambda: time.sleep(0.001)], repeats=3, target=0.002)
    >>> [len(each) for each in rounds], ratio_of_pairs(rounds[1], rounds[0]) > 1
    ([3, 3], True)
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if number is not None and number < 1:
        raise ValueError(f"number must be at least 1, got {number}")
    if number is None:
        counts = [_calls_for(function, target, warmup) for function in functions]
    else:
        for function in functions:
            for _ in range(warmup):
                function()
        counts = [number] * len(functions)
    samples: list[list[float]] = [[] for _ in functions]
    # like timeit: no garbage collection pause inside a timed round (it would land on one member
    # of a pair only)
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for round_index in range(repeats):
            for index in round_order(len(functions), round_index):
                function, count = functions[index], counts[index]
                start = time.perf_counter()
                for _ in range(count):
                    function()
                samples[index].append((time.perf_counter() - start) / count)
    finally:
        if collecting:
            gc.enable()
    return samples


def round_order(members: int, round_index: int) -> list[int]:
    """The order in which round ``round_index`` times ``members`` functions: a Williams design, so
    that over ``members`` rounds (twice as many for an odd count) every function comes right after
    every other one equally often and none always pays what one neighbour leaves behind (spinning
    threads, a dirty cache). A plain rotation would not do: it keeps each function's successor.

    >>> [round_order(4, r) for r in range(4)]
    [[0, 1, 3, 2], [1, 2, 0, 3], [2, 3, 1, 0], [3, 0, 2, 1]]
    >>> [round_order(3, r) for r in (0, 3)]
    [[0, 1, 2], [2, 1, 0]]
    """
    if members < 1:
        return []
    base, low, high = [0], 1, members - 1
    while len(base) < members:  # 0, 1, n-1, 2, n-2, ...: consecutive differences all distinct mod n
        base.append(low)
        low += 1
        if len(base) < members:
            base.append(high)
            high -= 1
    period = members if members % 2 == 0 else 2 * members
    shift = round_index % period
    order = [(value + shift) % members for value in base]
    return order if shift < members else order[::-1]


def ratio_of_pairs(times_a: Sequence[float], times_b: Sequence[float]) -> float:
    """The ratio of ``a`` to ``b`` from interleaved rounds: the median of ``a[r] / b[r]``.

    Each pair was timed back to back, so a load that comes and goes scales both of its members;
    the median then drops the rounds where it did not (a burst that hit only one of the two).

    >>> ratio_of_pairs([2.0, 2.2, 9.0], [1.0, 1.1, 1.0])  # the third round: a burst during a only
    2.0
    >>> ratio_of_pairs([4.0, 2.0, 2.0], [2.0, 1.0, 1.0])  # a slow round scales both: still 2
    2.0
    """
    if len(times_a) != len(times_b) or not times_a:
        raise ValueError(
            f"ratio_of_pairs needs two equally long, non-empty lists, got {len(times_a)} and {len(times_b)}"
        )
    if any(t <= 0 for t in times_b):
        raise ValueError("ratio_of_pairs: every time of b must be positive")
    return median(a / b for a, b in zip(times_a, times_b))


def ratio_spread(times_a: Sequence[float], times_b: Sequence[float]) -> float:
    """How far the pairs' ratios scatter around :func:`ratio_of_pairs`: their interquartile range
    divided by their median (0 when every round agrees). A caller times more rounds while it is
    large.

    >>> ratio_spread([2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0])
    0.0
    >>> round(ratio_spread([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 1.0, 1.0, 1.0, 1.0]), 3)
    0.667
    """
    ratios = sorted(a / b for a, b in zip(times_a, times_b))
    if not ratios:
        raise ValueError("ratio_spread needs at least one pair")
    middle = median(ratios)
    if len(ratios) < 4:
        return (ratios[-1] - ratios[0]) / middle
    lower, upper = _quantile(ratios, 0.25), _quantile(ratios, 0.75)
    return (upper - lower) / middle


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, linearly interpolated (numpy's default)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def best_medians(functions: Sequence[Callable[[], Any]], *, rounds: int, **timing: Any) -> list[float]:
    """Each function's best :func:`median_seconds` (given ``timing``'s keywords) over ``rounds`` rounds, the
    functions taken in the order :func:`round_order` rotates each round: a VM drifts over minutes, so rivals
    timed in alternation compare where one timed after the other would not, and the call right after
    PyTorch's pays its spinning threads, which the rotation spreads over all of them.

    >>> fast, slow = best_medians([lambda: None, lambda: time.sleep(0.002)], rounds=2, repeats=3, target=0.004)
    >>> fast < slow
    True
    """
    best = [float("inf")] * len(functions)
    for round_index in range(rounds):
        for index in round_order(len(functions), round_index):
            best[index] = min(best[index], median_seconds(functions[index], **timing))
    return best


def median_seconds(
    function: Callable[[], Any], *, repeats: int = 5, target: float = 0.04, number: int | None = None, warmup: int = 1
) -> float:
    """Median seconds per call of one function (:func:`interleaved_medians` of one).

    >>> 0 < median_seconds(lambda: sum(range(100)), repeats=3, target=0.001) < 0.1
    True
    """
    return interleaved_medians([function], repeats=repeats, target=target, number=number, warmup=warmup)[0]

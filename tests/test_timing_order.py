"""Timed members take turns at each position: the call right after PyTorch's parallel call pays for its
still-spinning threads, so a fixed order charged that to the same member every round."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from kdsl.bench.tune_bench import remeasure
from kdsl.runtime.timing import interleaved_samples, round_order


def assert_every_member_leads_once(orders: list[list[str]], members: set[str]) -> None:
    """Over as many rounds as members, each member is first in one round and follows a different one."""
    assert {order[0] for order in orders} == members
    assert all(sorted(order) == sorted(members) for order in orders)


def test_round_order_puts_every_member_after_every_other_equally_often() -> None:
    for members in range(2, 8):
        period = members if members % 2 == 0 else 2 * members
        orders = [round_order(members, r) for r in range(period)]
        assert_every_member_leads_once(
            [[str(i) for i in o] for o in orders[:members]], {str(i) for i in range(members)}
        )
        successions = Counter((a, b) for order in orders for a, b in pairwise(order))
        assert len(successions) == members * (members - 1) and len(set(successions.values())) == 1
    assert round_order(4, 5) == round_order(4, 1)
    assert round_order(0, 3) == []


def test_interleaved_samples_varies_the_order_and_keeps_samples_per_function() -> None:
    calls: list[str] = []
    functions = [lambda name=name: calls.append(name) for name in "abc"]
    samples = interleaved_samples(functions, repeats=3, number=1, warmup=0)
    rounds = [calls[i : i + 3] for i in range(0, 9, 3)]
    assert_every_member_leads_once(rounds, {"a", "b", "c"})
    assert [len(each) for each in samples] == [3, 3, 3]


class RecordingMeasurer:
    """Stands in for the tuner's measurer: each library's latency is fixed, and the calls are logged."""

    def __init__(self, log: list[str], latencies: dict[str, float]) -> None:
        self.log, self.latencies = log, latencies

    def time_library(self, library: str, check: bool = True) -> tuple[float | None, str | None]:
        self.log.append(library)
        return self.latencies[library], None


def test_remeasure_lets_pytorch_precede_each_library_in_turn() -> None:
    log: list[str] = []
    measurer = RecordingMeasurer(log, {"lib-a": 2.0, "lib-b": 3.0, "lib-d": 1.0})

    def time_torch() -> float:
        log.append("torch")
        return 4.0

    libraries = {"opevo": "lib-a", "gensor": "lib-b", "default schedule": "lib-d"}
    final, torch_s = remeasure(measurer, libraries, 4, time_torch, lambda name, error: None)
    rounds = [log[i : i + 4] for i in range(0, 16, 4)]
    assert_every_member_leads_once(rounds, {"lib-a", "lib-b", "lib-d", "torch"})
    followers_of_torch = {log[i + 1] for i in range(len(log) - 1) if log[i] == "torch"}
    assert followers_of_torch == {"lib-a", "lib-b", "lib-d"}
    assert final == {"opevo": 2.0, "gensor": 3.0, "default schedule": 1.0} and torch_s == 4.0


def test_remeasure_without_pytorch_times_only_the_libraries() -> None:
    log: list[str] = []
    final, torch_s = remeasure(RecordingMeasurer(log, {"x": 1.0}), {"default schedule": "x"}, 2, None, print)
    assert log == ["x", "x"] and final == {"default schedule": 1.0} and torch_s == float("inf")

"""The benches' summaries say "slower" when the second run is slower: never "-0.3 ms faster" or a
negative share (``kdsl.runtime.units.faster_or_slower`` and ``kdsl tune --network``'s propagation line)."""

from __future__ import annotations

import pytest

from kdsl.bench.network_tune import propagation_summary
from kdsl.runtime.units import faster_or_slower

#: the four networks of one batch size that the propagation line reads (kdsl.bench.network_tune)
NETWORKS = (
    "its transforms alone (no propagation)",
    "its transforms alone (propagated)",
    "kdsl tuned, blocked, no propagation",
    "kdsl tuned, blocked, propagated",
)


@pytest.mark.parametrize(
    ("saved", "words"),
    [
        (0.3, "0.300 ms faster"),
        (-0.3, "0.300 ms slower"),
        (12.0, "12.000 ms faster"),
        (-0.0004, "as fast (within 0.001 ms)"),
        (0.0, "as fast (within 0.001 ms)"),
    ],
)
def test_a_saving_reads_faster_and_a_loss_slower(saved, words):
    assert faster_or_slower(saved) == words


def test_the_unit_and_decimals_are_the_callers():
    assert faster_or_slower(-2.5, unit="us", decimals=1) == "2.5 us slower"
    assert faster_or_slower(float("inf")).startswith("not comparable")


def summary(transforms: float, left: float, unpropagated: float, propagated: float) -> str:
    """The propagation line of one batch size whose four networks took these milliseconds."""
    rows = [
        {"batch": 8, "network": name, "ms": ms}
        for name, ms in zip(NETWORKS, (transforms, left, unpropagated, propagated))
    ]
    lines = propagation_summary(rows)
    assert len(lines) == 1 and lines[0].startswith("batch 8: ")
    return lines[0]


def test_a_faster_propagated_network_reads_faster():
    line = summary(4.0, 1.0, 20.0, 17.6)
    assert "(75% of the transform time removed)" in line
    assert line.endswith("the propagated network is 2.400 ms faster (60% of that transform time)")


def test_a_slower_propagated_network_reads_slower_with_a_positive_share():
    line = summary(4.0, 5.0, 20.0, 21.0)
    assert "(25% more transform time)" in line
    assert line.endswith("the propagated network is 1.000 ms slower (25% of that transform time)")
    assert "-" not in line.split(": ", 1)[1]  # no negative number anywhere in the words


def test_no_transform_time_divides_nothing():
    line = summary(0.0, 0.0, 20.0, 20.0)
    assert "no transform time to remove" in line and line.endswith("as fast (within 0.001 ms)")


def test_one_line_per_batch_size_in_order():
    rows = [{"batch": b, "network": n, "ms": 1.0} for b in (8, 1) for n in NETWORKS]
    lines = propagation_summary(rows)
    assert [line.split(":")[0] for line in lines] == ["batch 1", "batch 8"]

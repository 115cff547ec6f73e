"""The space keeps its verdicts: the driver reads back the check a tuner ran on a proposal instead of
applying the schedule again, and a run reports every candidate the space refused (the ones a tuner
dropped before proposing included)."""

from __future__ import annotations

import zlib
from collections import Counter

import pytest
from backends import backend
from test_space_rules import CASES, _FakeMeasurer, _space

from kdsl import gallery
from kdsl.codegen.tvm.parameters import config_key
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.lang.errors import LoweringError

backend("tvm")


def test_a_verdict_is_kept_and_a_repeated_check_applies_nothing(monkeypatch):
    space = _space("matmul")
    applied = Counter()
    original = ScheduleSpace.apply

    def counting(self, config, **kwargs):
        applied[config_key(self.validate(config))] += 1
        return original(self, config, **kwargs)

    monkeypatch.setattr(ScheduleSpace, "apply", counting)
    config = space.heuristic()
    broken = {**config, "stage0.tile.M": (2, 1, 32), "stage0.block": "M:2"}  # conflicts' doctest: no apply
    first = [space.rejection(config), space.rejection(broken)]
    again = [space.rejection(dict(config)), space.rejection(dict(broken))]
    assert first == again and first[0] is None and "S.block M:2" in first[1]
    assert applied == {config_key(config): 1}
    assert space.verdicts == {config_key(config): None, config_key(broken): first[1]}


@pytest.mark.parametrize("tuner", ["opevo", "gensor"])
def test_the_driver_applies_no_proposal_twice_and_counts_what_the_tuner_dropped(tmp_path, monkeypatch, tuner):
    from kdsl.tune.driver import tune

    applied, verdicts = Counter(), {}
    original_apply, original_rejection = ScheduleSpace.apply, ScheduleSpace.rejection

    def refusing(self, config, **kwargs):
        """Apply, refusing a third of the configurations (by their key) as TVM would refuse them."""
        key = config_key(self.validate(config))
        applied[key] += 1
        if zlib.crc32(key.encode()) % 3 == 0:
            raise LoweringError("refused by this test")
        return original_apply(self, config, **kwargs)

    def recording(self, config):
        verdicts[config_key(self.validate(config))] = reason = original_rejection(self, config)
        return reason

    monkeypatch.setattr(ScheduleSpace, "apply", refusing)
    monkeypatch.setattr(ScheduleSpace, "rejection", recording)
    measurer = _FakeMeasurer()
    result = tune(
        gallery.load("conv2d"),
        CASES["conv2d"],
        tuner,
        16,
        tmp_path / "t.db",
        measurer=measurer,
        options={"steps": 40, "walks": 2} if tuner == "gensor" else {},
        confirm=0,
        cost_model=False,
    )
    assert len(measurer.measured) == result.measured == 16 and result.rejected == 0
    assert max(applied.values()) == 1  # the tuner's check applied each once; the driver read its verdict
    assert all(applied[config_key(c)] == 1 for c in measurer.measured)
    dropped = [key for key, reason in verdicts.items() if reason is not None]
    assert any(reason == "refused by this test" for reason in verdicts.values())  # the test refused some
    assert result.refused == len(dropped) > 0

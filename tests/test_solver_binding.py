"""Backends build from the binding the solver returns (issue 25): a module or a TVM lowering made from
``solve.check``'s or ``solve.bind``'s binding does not solve the sizes again, and a binding changed
after the check is solved again (and refused where it breaks a constraint)."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from backends import backend

from kdsl import solve
from kdsl.codegen import torch as kdsl_torch
from kdsl.lang import library
from kdsl.lang.errors import DivisibilityError

backend("torch")

SOLVING = ("bind", "resolve_binding", "_violated")


def _solver_calls(action) -> Counter:
    """How often ``action`` enters the solver's binding functions."""
    calls: Counter = Counter()

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.endswith("constraints.py") and code.co_name in SOLVING:
            calls[code.co_name] += 1

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    assert isinstance(calls, Counter)
    return calls


def test_modules_built_from_check_bindings_solve_nothing_again() -> None:
    op = library.load("grouped_conv2d")
    report = solve.check(op, "resnet18")
    bindings = [binding for _, binding in report]
    assert all(binding.checked_for(op) for binding in bindings)
    assert _solver_calls(lambda: [kdsl_torch.build(op, binding) for binding in bindings]) == Counter()
    # the same layers given as plain dicts are solved once each (another class name: not from the cache)
    plain = [dict(binding) for binding in bindings]
    again = _solver_calls(lambda: [kdsl_torch.build(op, binding, name="Plain") for binding in plain])
    assert again["bind"] == len(plain)


def test_a_tvm_lowering_from_a_checked_binding_solves_nothing_again() -> None:
    backend("tvm")
    from kdsl.codegen.tvm import lower

    op = library.load("conv2d")
    binding = solve.bind(op, {"N": 1, "Cin": 8, "Cout": 8, "H": 6, "W": 6})
    assert _solver_calls(lambda: lower(op, binding)) == Counter()
    assert lower(op, binding).binding == lower(op, dict(binding)).binding


def test_a_binding_changed_after_the_check_is_checked_again() -> None:
    op = library.load("grouped_conv2d")
    binding = solve.bind(op, {"N": 1, "Cin": 8, "Cout": 8, "H": 6, "W": 6, "G": 2})
    binding["G"] = 3  # 8 channels do not split into 3 groups
    assert not binding.checked_for(op)
    with pytest.raises(DivisibilityError, match="G"):
        kdsl_torch.build(op, binding)


def test_a_binding_checked_for_one_operator_is_solved_again_for_another() -> None:
    conv, grouped = library.load("conv2d"), library.load("grouped_conv2d")
    binding = solve.bind(conv, {"N": 1, "Cin": 8, "Cout": 8, "H": 6, "W": 6})
    assert not binding.checked_for(grouped)
    assert _solver_calls(lambda: kdsl_torch.build(grouped, {**binding, "G": 2}, name="Other"))["bind"] == 1

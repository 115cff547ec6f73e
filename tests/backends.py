"""The backends a test run covers: ``KDSL_TEST_BACKENDS=reference,torch,tvm`` (the default: all).

A test that needs a backend asks for it with :func:`backend`: a requested backend that cannot be
imported fails the test (a CI machine without TVM must not pass by skipping every TVM test), and one
left out of ``KDSL_TEST_BACKENDS`` skips it, saying so.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

#: the backends a run can ask for, and the module each needs
MODULES = {"reference": "numpy", "torch": "torch", "tvm": "tvm"}


def requested() -> set[str]:
    """The backends ``KDSL_TEST_BACKENDS`` names (all when it is unset or empty)."""
    text = os.environ.get("KDSL_TEST_BACKENDS", "").strip()
    names = {part.strip() for part in text.split(",") if part.strip()} if text else set(MODULES)
    unknown = names - set(MODULES)
    if unknown:
        raise pytest.UsageError(f"KDSL_TEST_BACKENDS names {sorted(unknown)}: choose from {', '.join(MODULES)}")
    return names


def backend(name: str) -> ModuleType:
    """The module of backend ``name`` (``torch``, ``tvm``, ``reference``): the test is skipped when the run
    leaves the backend out, and fails when the run asks for it and it cannot be imported."""
    if name not in MODULES:
        raise ValueError(f"unknown backend {name!r}: choose from {', '.join(MODULES)}")
    if name not in requested():
        pytest.skip(f"backend {name} left out by KDSL_TEST_BACKENDS", allow_module_level=True)
    try:
        return importlib.import_module(MODULES[name])
    except ImportError as error:
        pytest.fail(
            f"backend {name} is requested (KDSL_TEST_BACKENDS, default all) but cannot be imported: {error}; "
            f"install it or leave it out with KDSL_TEST_BACKENDS",
            pytrace=False,
        )


def listed() -> list[str]:
    """The requested backends, in the order reference, torch, tvm (for tests that loop over them)."""
    chosen = requested()
    return [name for name in MODULES if name in chosen]


def codegen(name: str) -> ModuleType:
    """kdsl's code generator for backend ``torch`` or ``tvm``, imported (TVM loaded): a test file calls this
    at collection for each backend the run requests, so one that fails to import fails the run there."""
    module = importlib.import_module(f"kdsl.codegen.{name}")
    if name == "tvm":
        module.load_tvm()
    return module


def data_inputs(x) -> tuple:
    """The data inputs of a call: ``x`` itself when it is the tuple a kernel of several inputs takes, else
    the one array."""
    return x if isinstance(x, tuple) else (x,)


def output_or_error(name: str, op, layer: dict[str, int], x, weights: list) -> object:
    """Backend ``name``'s output of ``op`` on ``x`` (numpy; a tuple of arrays for a kernel of several
    inputs), or the exception it raised. The module or kernel is built in float32 where the data inputs
    are float32 arrays, else in float64 (the reference computes in the arrays' own precision)."""
    from kdsl.codegen import reference

    try:
        if name == "reference":
            return reference.run(op, layer, x, weights)
        import torch

        single = str(data_inputs(x)[0].dtype) == "float32"
        xs = [torch.from_numpy(a) for a in data_inputs(x)]
        if name == "torch":
            module = codegen("torch").build(op, layer).to(torch.float32 if single else torch.float64)
            with torch.no_grad():
                for parameter, value in zip(module.weights, weights):
                    parameter.copy_(torch.from_numpy(value))
                return module(*xs).numpy()
        kernel = codegen("tvm").build(op, layer, dtype="float32" if single else "float64")
        return kernel(*xs, *[torch.from_numpy(w) for w in weights]).numpy()
    except Exception as error:  # the caller tells a KdslError from a crash
        return error


def run_backend(name: str, op, layer: dict[str, int], x, weights: list) -> object:
    """:func:`output_or_error`'s output, where the backend raised that exception raised here (for a test
    that lets an error propagate or catches the one it expects)."""
    result = output_or_error(name, op, layer, x, weights)
    if isinstance(result, Exception):
        raise result
    return result

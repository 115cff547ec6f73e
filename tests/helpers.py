"""Checks several test files make alike (one copy here): two operators compute one function, a
PyTorch module gives the reference's output, generated source runs without kdsl; and the settings
of a discovery run small enough for a test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from kdsl.lang.operator import Operator

#: a discovery run small enough for a test (one tiny proxy network, one latency layer); each test
#: file adds its time limit
TINY_DISCOVERY = {
    "batch": 2,
    "workers": 1,
    "epochs": 1,
    "max_depth": 4,
    # all clean training images: one epoch of the tiny network must learn something
    "proxy": {"widths": [8], "image_size": 8, "train_samples": None, "shift": 0, "noise": 0.0},
    "latency_layers": [{"name": "tiny", "N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8}],
    "coefficients": {"K": [3], "G": [2], "s": [2]},
}


def assert_same_function(op: Operator, other: Operator, layer: dict[str, int], seed: int) -> None:
    """``other`` computes ``op``'s function (reference interpreter, float64, same weights by name)."""
    from kdsl.codegen import reference

    x, weights = reference.random_inputs(op, layer, seed=seed)
    by_name = {w.name: array for w, array in zip(op.weights, weights)}
    expected = reference.run(op, layer, x, weights)
    got = reference.run(other, layer, x, [by_name[w.name] for w in other.weights])
    assert np.allclose(got, expected, rtol=1e-9, atol=1e-9)


def assert_module_matches_reference(
    module, op: Operator, layer: dict[str, int], x: np.ndarray, weights: list[np.ndarray], rtol: float, atol: float
) -> None:
    """The PyTorch ``module`` (float64), given ``weights``, maps ``x`` to the reference's output of ``op``."""
    import torch

    from kdsl.codegen import reference

    with torch.no_grad():
        for parameter, value in zip(module.weights, weights):
            parameter.copy_(torch.from_numpy(value))
        got = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, reference.run(op, layer, x, weights), rtol=rtol, atol=atol, equal_nan=False)


def assert_generated_source_runs_without_kdsl(
    tmp_path: Path,
    op: Operator,
    layer: dict[str, int],
    binding: dict[str, int],
    x: np.ndarray,
    weights: list[np.ndarray],
) -> None:
    """The PyTorch source generated for ``op`` at ``binding`` (``layer``, solved), run in a Python where ``import kdsl``
    fails, gives the reference's output on ``x`` and refuses an input of the wrong shape with its
    own ShapeError."""
    from kdsl.codegen import reference
    from kdsl.codegen import torch as kdsl_torch

    expected = reference.run(op, layer, x, weights)
    (tmp_path / "generated.py").write_text(kdsl_torch.source(op, binding, name="Generated"))
    np.savez(tmp_path / "data.npz", *weights, x=x, expected=expected)
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["kdsl"] = None  # any `import kdsl` now fails
        sys.path.insert(0, {str(tmp_path)!r})
        import numpy as np, torch
        from generated import Generated, ShapeError
        data = np.load({str(tmp_path / "data.npz")!r})
        module = Generated(**{dict(binding)!r}).double()
        with torch.no_grad():
            for i, parameter in enumerate(module.weights):
                parameter.copy_(torch.from_numpy(data[f"arr_{{i}}"]))
            out = module(torch.from_numpy(data["x"])).numpy()
        assert np.allclose(out, data["expected"], rtol=1e-10, atol=1e-12), "mismatch"
        try:
            module(torch.zeros(1))
        except ShapeError:
            print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr

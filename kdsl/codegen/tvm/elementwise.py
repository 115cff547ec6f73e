"""Element-wise functions as TIR expressions: Map's functions and Blend's operations.

In float64 the transcendental functions are LLVM's (libm calls: exact to an ulp, scalar). In float32
LLVM has no vector forms of ``exp``, ``sin``, ``tanh`` or ``erf`` here (it calls ``expf`` once per
element: a Map("sin") over a ResNet-18 activation ran 30x slower than PyTorch's vectorized SLEEF),
so they are written as polynomials that vectorize: Cephes' ``expf`` (range reduction by ln 2, degree-6
polynomial, 2**n built in the exponent bits), a Taylor ``sin`` after reduction by pi (terms to r**13:
error below 3e-9 on [-pi/2, pi/2], plus the reduction's rounding, growing with |x|), and the rational
``tanh`` and ``erf`` of Eigen that TVM's ``topi.fast_tanh`` / ``fast_erf`` use. Their errors are a few
float32 ulps (checked against float64 in tests/test_graph_tvm.py).

>>> sorted(MAP_FORMS) == sorted(__import__("kdsl.lang.nonlinear", fromlist=["x"]).MAP_FUNCTIONS)
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: float32 forms are used for these dtypes (float64 keeps LLVM's exact library calls)
FAST_DTYPES = frozenset({"float32"})

_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_TANH_ALPHA = (
    -2.76076847742355e-16,
    2.00018790482477e-13,
    -8.60467152213735e-11,
    5.12229709037114e-08,
    1.48572235717979e-05,
    6.37261928875436e-04,
    4.89352455891786e-03,
)
_TANH_BETA = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
_ERF_ALPHA = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_BETA = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)


def _horner(tvm: Any, x: Any, coefficients: tuple[float, ...], dtype: str) -> Any:
    value = tvm.tirx.const(coefficients[0], dtype)
    for c in coefficients[1:]:
        value = value * x + tvm.tirx.const(c, dtype)
    return value


def _clamp(tvm: Any, x: Any, low: float, high: float, dtype: str) -> Any:
    return tvm.tirx.max(tvm.tirx.min(x, tvm.tirx.const(high, dtype)), tvm.tirx.const(low, dtype))


def _let(tvm: Any, value: Any, body: Callable[[Any], Any], name: str = "t") -> Any:
    """``body(v)`` with ``v`` bound to ``value`` once (a value used several times is not a copy of its tree)."""
    var = tvm.tirx.Var(name, value.ty if hasattr(value, "ty") else value.dtype)  # a TensorSlice has no .ty
    return tvm.tirx.Let(var, value, body(var))


def fast_exp(tvm: Any, x: Any, dtype: str) -> Any:
    """Cephes' expf: ``x = n ln2 + r``, ``exp(r)`` by a polynomial, ``2**n`` in the exponent bits."""
    tirx = tvm.tirx

    def c(v: float) -> Any:
        return tirx.const(v, dtype)

    def with_x(x: Any) -> Any:
        def with_n(n: Any) -> Any:
            def with_r(r: Any) -> Any:
                y = (_horner(tvm, r, _EXP_POLY, dtype) * r * r) + r + c(1.0)
                return y * tirx.reinterpret(dtype, (n.astype("int32") + 127) << 23)

            return _let(tvm, x - n * c(0.693359375) - n * c(-2.12194440e-4), with_r, "r")  # ln 2 in two parts

        return _let(tvm, tirx.round(x * c(1.44269504088896341)), with_n, "n")

    return _let(tvm, _clamp(tvm, x, -88.3762626647949, 88.3762626647950, dtype), with_x, "x")


def fast_sin(tvm: Any, x: Any, dtype: str) -> Any:
    """``x = k pi + r`` (pi in three parts), ``sin(r)`` by its Taylor series to r**13, sign ``(-1)**k``."""
    tirx = tvm.tirx
    taylor = tuple((-1) ** (n // 2) / math.factorial(n) for n in range(13, 0, -2))  # 1/13!, .., -1/3!, 1

    def c(v: float) -> Any:
        return tirx.const(v, dtype)

    def with_x(x: Any) -> Any:
        def with_k(k: Any) -> Any:
            def with_y(y: Any) -> Any:
                return tirx.Select(tirx.floormod(k.astype("int32"), 2) == 1, -y, y)

            def with_r(r: Any) -> Any:
                return _let(tvm, _horner(tvm, r * r, taylor, dtype) * r, with_y, "y")

            reduced = x - k * c(3.140625) - k * c(9.67502593994140625e-4) - k * c(1.509957990978376432e-7)
            return _let(tvm, reduced, with_r, "r")

        return _let(tvm, tirx.round(x * c(1 / math.pi)), with_k, "k")

    return _let(tvm, x, with_x, "x")


def _rational(tvm: Any, x: Any, bound: float, alpha: tuple[float, ...], beta: tuple[float, ...], dtype: str) -> Any:
    """``x p(x**2) / q(x**2)`` for ``x`` clamped to ``[-bound, bound]``."""

    def with_x(x: Any) -> Any:
        return _let(tvm, x * x, lambda x2: x * _horner(tvm, x2, alpha, dtype) / _horner(tvm, x2, beta, dtype), "x2")

    return _let(tvm, _clamp(tvm, x, -bound, bound, dtype), with_x, "x")


def fast_tanh(tvm: Any, x: Any, dtype: str) -> Any:
    """Eigen's rational tanh on [-9, 9] (tanh is +-1 to float32 precision outside)."""
    return _rational(tvm, x, 9.0, _TANH_ALPHA, _TANH_BETA, dtype)


def fast_erf(tvm: Any, x: Any, dtype: str) -> Any:
    """Eigen's rational erf on [-4, 4] (erf is +-1 to float32 precision outside)."""
    return _rational(tvm, x, 4.0, _ERF_ALPHA, _ERF_BETA, dtype)


def exp(tvm: Any, x: Any, dtype: str) -> Any:
    """``e**x`` (the fast form in float32)."""
    return fast_exp(tvm, x, dtype) if dtype in FAST_DTYPES else tvm.tirx.exp(x)


def _map_forms() -> dict[str, Callable[[Any, Any, str, float], Any]]:
    def fast_or(fast: Callable[[Any, Any, str], Any], exact: str) -> Callable[[Any, Any, str, float], Any]:
        return lambda tvm, x, dtype, by: fast(tvm, x, dtype) if dtype in FAST_DTYPES else getattr(tvm.tirx, exact)(x)

    def sigmoid(tvm: Any, x: Any, dtype: str, by: float) -> Any:
        one = tvm.tirx.const(1.0, dtype)
        return one / (one + exp(tvm, -x, dtype))

    def gelu(tvm: Any, x: Any, dtype: str, by: float) -> Any:
        # the exact form (torch's default): x * (1 + erf(x / sqrt 2)) / 2
        def with_x(x: Any) -> Any:
            scaled = x * tvm.tirx.const(1 / math.sqrt(2), dtype)
            erf = fast_erf(tvm, scaled, dtype) if dtype in FAST_DTYPES else tvm.tirx.erf(scaled)
            return x * (tvm.tirx.const(1.0, dtype) + erf) * tvm.tirx.const(0.5, dtype)

        return _let(tvm, x, with_x, "g")

    return {
        "relu": lambda tvm, x, dtype, by: tvm.tirx.max(x, tvm.tirx.const(0.0, dtype)),
        "abs": lambda tvm, x, dtype, by: tvm.tirx.abs(x),
        "neg": lambda tvm, x, dtype, by: -x,
        "sin": fast_or(fast_sin, "sin"),
        "exp": lambda tvm, x, dtype, by: exp(tvm, x, dtype),
        "sigmoid": sigmoid,
        "tanh": fast_or(fast_tanh, "tanh"),
        "gelu": gelu,
        "scale": lambda tvm, x, dtype, by: x * tvm.tirx.const(by, dtype),
    }


#: Map's functions: ``form(tvm, x, dtype, by)`` -> the TIR expression of ``f(x)``
MAP_FORMS: dict[str, Callable[[Any, Any, str, float], Any]] = _map_forms()

#: Blend's operations: ``form(tvm, a, b)``
BLEND_FORMS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "add": lambda tvm, a, b: a + b,
    "sub": lambda tvm, a, b: a - b,
    "mul": lambda tvm, a, b: a * b,
    "min": lambda tvm, a, b: tvm.tirx.min(a, b),
    "max": lambda tvm, a, b: tvm.tirx.max(a, b),
}

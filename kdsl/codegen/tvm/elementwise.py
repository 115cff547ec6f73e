"""Element-wise functions as TIR expressions: Map's functions, Blend's operations, the folds' order keys.

Every form is plain TIR (selects, ``isnan``, arithmetic, bit casts and the float64 intrinsics), so it
lowers on LLVM and CUDA alike.

**NaN** goes through as in PyTorch: ``relu(NaN)``, ``max(NaN, x)``, ``min(x, NaN)``, a max/min fold
or a softmax row holding a NaN are NaN. TIR's ``max``/``min`` are not (``a > b ? a : b`` on LLVM,
``fmaxf`` on CUDA), nor is a clamp, so the forms here compare with ``isnan`` where a NaN could be
lost (:func:`nan_max`, :func:`order_key` for folds, the guards of the clamped polynomials).

**Accuracy.** In float64 the transcendental functions are the intrinsics (libm on LLVM). In float32
LLVM has no vector forms of ``exp``, ``sin``, ``tanh`` or ``erf`` here (it calls ``expf`` once per
element: a Map("sin") over a ResNet-18 activation ran 30x slower than PyTorch's vectorized SLEEF), so
they are written as arithmetic that vectorizes: Cephes' ``expf`` (range reduction by ln 2, degree-6
polynomial, ``2**n`` built in two exponent-bit factors so that the whole range from the subnormals to
``exp(88.72)`` stays finite and is rounded once), Eigen's rational ``tanh`` and ``erf`` (gelu's tail
below x = -0.5 by ``erfc = e**(-z**2) erfcx(z)`` in float64, erfcx fitted here), and a ``sin`` whose
argument reduction is exact (Payne-Hanek in float64 arithmetic: no float32 reduction is exact
for |x| up to 3.4e38). Their float32 errors against a float64 truth (tests/test_elementwise_math.py
sweeps ~255 000 values log-uniform over the whole float32 range, both signs, subnormals, +-0, +-inf,
NaN, the overflow/underflow edges and the float32s nearest multiples of pi/2, one kernel per map):

========  ==========  ==========================================================================
map       ulps (max)  domain and notes
========  ==========  ==========================================================================
relu      0           all float32 (exact; -0 stays -0, NaN stays NaN, as ``torch.relu``)
abs       0           all float32 (exact)
neg       0           all float32 (exact)
scale     1           all float32 (``by`` rounded to float32, then one product)
sin       1           all float32 (exact reduction, float64 polynomials, one rounding; sin(+-inf) NaN)
exp       2           all float32 (inf above 88.7228, 0 below -103.97, subnormals in between)
sigmoid   3           all float32 (``exp(-|x|)`` form: subnormal results below x = -87.3)
tanh      5           all float32 (x itself below 2**-13, +-1 beyond +-9)
gelu      3           all float32 (below x = -0.5 via erfc in float64; gelu(-inf) is NaN, as
                      ``F.gelu``)
========  ==========  ==========================================================================

(A ulp is that of the float64 truth's float32 binade, 2**-149 among the subnormals; where the truth
rounds to an infinity or is NaN the result must be that exactly.) Measured maxima on the sweep: relu,
abs, neg 0; scale 0.68; sin 0.50; exp 0.94; sigmoid 2.2; tanh 3.9; gelu 2.5 (0.50 below x = -0.5,
where ``1 + erf`` had cancelled to 35 ulps at x = -2 and to nothing by x = -6).

**Speed** (a Map over 1M float32 elements, default schedule, 2 threads; main -> here, best runs on a
shared VM, +-30 %): relu 0.10 -> 0.10 ms, exp 0.24 -> 0.30-0.37, sigmoid 0.29 -> 0.43-0.51 (the
two-factor ``2**n``, the NaN select, the ``exp(-|x|)`` form), tanh 0.25 -> 0.29, gelu 0.35 -> 2.1
(its float64 erfc tail, evaluated for every element by the vector select), sin 0.27 -> 2.6 (the exact
reduction: 9 float64 digit products; libm's float64 ``sin`` took 20 ms). A max fold along rows of
3136: 0.08 -> 0.11 ms (order keys; a float select that keeps NaN took 0.25).

>>> sorted(MAP_FORMS) == sorted(__import__("kdsl.lang.nonlinear", fromlist=["x"]).MAP_FUNCTIONS)
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: each Map's largest float32 error in ulps against a float64 truth, and the lowest x where that bound
#: holds (-inf: all float32); the table in the docstring, swept by tests/test_elementwise_math.py
ULP_BOUNDS: dict[str, tuple[float, float]] = {
    "relu": (0.0, -math.inf),
    "abs": (0.0, -math.inf),
    "neg": (0.0, -math.inf),
    "scale": (1.0, -math.inf),
    "sin": (1.0, -math.inf),
    "exp": (2.0, -math.inf),
    "sigmoid": (3.0, -math.inf),
    "tanh": (5.0, -math.inf),
    "gelu": (3.0, -math.inf),
}

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


def _is_nan(tvm: Any, x: Any) -> Any:
    return tvm.tirx.isnan(x)


def nan_max(tvm: Any, a: Any, b: Any) -> Any:
    """``max(a, b)``, NaN if either is (``torch.maximum``). TIR's ``max`` is ``a > b ? a : b`` on LLVM
    (NaN only when ``b`` is) and ``fmaxf`` on CUDA (NaN never): neither is PyTorch's. Two ordered
    compares: neither holds only when one operand is NaN, and then ``a + b`` is NaN."""
    return tvm.tirx.Select(a > b, a, tvm.tirx.Select(b >= a, b, a + b))


def nan_min(tvm: Any, a: Any, b: Any) -> Any:
    """``min(a, b)``, NaN if either is (``torch.minimum``)."""
    return tvm.tirx.Select(a < b, a, tvm.tirx.Select(b <= a, b, a + b))


#: the integer type whose order keys a float type (:func:`order_key`)
_KEY_DTYPES = {"float32": "int32", "float64": "int64", "float16": "int16"}


def key_dtype(dtype: str) -> str:
    """The integer type of :func:`order_key` for floats of ``dtype``."""
    return _KEY_DTYPES[dtype]


def _sign_flip_mask(tvm: Any, bits: Any, key: str) -> Any:
    """All magnitude bits where ``bits`` (a float's, or a key's) has its sign bit set, else 0."""
    width = int(key.removeprefix("int"))
    return (bits >> (width - 1)) & tvm.tirx.const((1 << (width - 1)) - 1, key)


def order_key(tvm: Any, x: Any, dtype: str, how: str) -> Any:
    """An integer whose signed order is the float order of ``x`` with NaN above everything (``how="max"``)
    or below everything (``"min"``), so that an integer max (min) fold is PyTorch's NaN-propagating
    ``amax`` (``amin``) and :func:`from_order_key` gives the float back.

    A float's bits read as a signed integer order the non-negative floats already; flipping the
    magnitude bits of the negative ones reverses their order below them (-0 just under +0). Why keys
    rather than a NaN-aware float combiner: a max fold along a row is one accumulator's dependency
    chain, and any float select that keeps NaN from both operands puts a compare and two blends on it
    (3x slower than ``vmaxps``); the key's arithmetic is off the chain and an integer max is one cycle.
    """
    tirx = tvm.tirx
    key = key_dtype(dtype)
    nan_key = tirx.max_value(key) if how == "max" else tirx.min_value(key)

    def with_x(x: Any) -> Any:
        def with_bits(bits: Any) -> Any:
            return tirx.Select(tirx.isnan(x), nan_key, bits ^ _sign_flip_mask(tvm, bits, key))

        return _let(tvm, tirx.reinterpret(key, x), with_bits, "bits")

    return _let(tvm, x, with_x, "k")


def from_order_key(tvm: Any, key: Any, dtype: str) -> Any:
    """The float whose :func:`order_key` is ``key``, a buffer read (the flip is its own inverse; NaN's
    key is a NaN). No ``Let`` here: the read-back stage is inlined into each of its readers, and one
    variable bound in several blocks conflicts in TVM's analyzer ("Binding of variable key ... conflicts
    with previous binding"; a fold read by a softmax's three stages)."""
    return tvm.tirx.reinterpret(dtype, key ^ _sign_flip_mask(tvm, key, key_dtype(dtype)))


def _exponent_scale(tvm: Any, n: Any, dtype: str) -> Any:
    """``2**n`` for an int32 ``n`` in [-126, 127], built in a float32's exponent bits."""
    return tvm.tirx.reinterpret(dtype, (n + 127) << 23)


def fast_exp(tvm: Any, x: Any, dtype: str) -> Any:
    """float32 ``e**x``: ``x = n ln2 + r`` (ln 2 in two parts, Cody-Waite), ``exp(r)`` by Cephes'
    degree-6 polynomial, then ``2**n`` as two factors ``2**(n//2) * 2**(n - n//2)``: one factor of
    ``2**n`` leaves float32's exponent range at both ends (``exp(88.5)`` = 2.7e38 came out inf, and
    results below 2**-126 lost their subnormal digits), two stay inside it for ``n`` in [-150, 128].
    ``x`` is clamped to [-104, 89] (beyond: 0 and inf, after rounding); NaN is selected through
    (the clamp would turn it into a number on either target)."""
    tirx = tvm.tirx

    def c(v: float) -> Any:
        return tirx.const(v, dtype)

    def with_x(x: Any) -> Any:
        def with_n(n: Any) -> Any:
            def with_r(r: Any) -> Any:
                y = (_horner(tvm, r, _EXP_POLY, dtype) * r * r) + r + c(1.0)
                n_int = n.astype("int32")
                half = n_int >> 1  # floor(n / 2): an arithmetic shift
                return y * _exponent_scale(tvm, half, dtype) * _exponent_scale(tvm, n_int - half, dtype)

            return _let(tvm, x - n * c(0.693359375) - n * c(-2.12194440e-4), with_r, "r")  # ln 2 in two parts

        return _let(tvm, tirx.round(x * c(1.44269504088896341)), with_n, "n")

    def guarded(raw: Any) -> Any:
        return tirx.Select(_is_nan(tvm, raw), raw, _let(tvm, _clamp(tvm, raw, -104.0, 89.0, dtype), with_x, "x"))

    return _let(tvm, x, guarded, "e")


def _pi_times_two_to(bits: int) -> int:
    """``floor(pi * 2**bits)``, by Machin's formula ``pi = 16 atan(1/5) - 4 atan(1/239)`` in integers
    (20 guard bits absorb the truncation of each series term)."""
    guard = 20
    one = 1 << (bits + guard)

    def arctan_of_inverse(n: int) -> int:
        total, power, k, sign = 0, one // n, 1, 1
        while power:
            total += sign * (power // k)
            power //= n * n
            k += 2
            sign = -sign
        return total

    return (16 * arctan_of_inverse(5) - 4 * arctan_of_inverse(239)) >> guard


#: 2/pi in 24-bit digits: ``2/pi = sum_j d_j 2**(-24 (j + 1))`` (to 2**-216). A float32 times a digit
#: is exact in float64 (24 + 24 bits). 9 digits reach from float32's largest exponent (2**127) down to
#: 2**-85 below the units of ``x * 2/pi``: enough for the float32 nearest a multiple of pi/2.
_DIGIT_BITS = 24
_TWO_OVER_PI_DIGITS: tuple[int, ...] = tuple(
    (((1 << (2 * 224 + 1)) // _pi_times_two_to(224)) >> (224 - _DIGIT_BITS * (j + 1))) & ((1 << _DIGIT_BITS) - 1)
    for j in range(9)
)
#: Taylor coefficients of sin(t)/t and cos(t) in t**2, highest first: on |t| <= pi/4 the first omitted
#: terms are 6e-12 and 5e-13, far below float32's 6e-8
_SIN_TAYLOR = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(5, -1, -1))
_COS_TAYLOR = tuple((-1) ** k / math.factorial(2 * k) for k in range(6, -1, -1))


def wide_sin(tvm: Any, x: Any, dtype: str) -> Any:
    """float32 ``sin`` with an exact argument reduction (Payne-Hanek) in float64 arithmetic, vectorizable.

    A reduction by pi in float32 parts fails past |x| ~ 1e5 (sin(1e9) came out 0.395 for 0.546,
    sin(3e9) 4.4e19). Here ``x * 2/pi`` is a sum of exact float64 products ``x 2**(-24 (j+1)) d_j`` (2/pi
    in 24-bit digits, :data:`_TWO_OVER_PI_DIGITS`), each reduced exactly modulo 4 (``t - 4 round(t/4)``, exact;
    0 once ``t`` is a multiple of 8). Their rounded sum gives the quadrant ``n``; the remainder
    ``r = (s_0 - n) + s_1 + ...``, added largest first, cancels exactly and keeps its relative precision
    however close ``x`` is to a multiple of pi/2. Then ``sin`` or ``cos`` of ``r pi/2`` (|.| <= pi/4) by
    Taylor polynomials, the sign by the quadrant, one rounding to float32. |x| < 2**-12 gives ``x``
    (sin x = x to float32 precision; -0 stays -0). NaN and +-inf give NaN.
    """
    tirx = tvm.tirx

    def c(value: float) -> Any:
        return tirx.const(value, "float64")

    def with_wide(wide: Any) -> Any:
        def with_parts(parts: list[Any], scaled: Any) -> Any:
            """``parts``: the reduced ``s_j`` so far; ``scaled``: ``wide * 2**(-24 len(parts))``."""
            j = len(parts)
            if j < len(_TWO_OVER_PI_DIGITS):

                def with_scaled(next_scaled: Any) -> Any:
                    def with_t(t: Any) -> Any:
                        reduced = t - c(4.0) * tirx.round(t * c(0.25))
                        return _let(tvm, reduced, lambda s_j: with_parts([*parts, s_j], next_scaled), f"s{j}")

                    return _let(tvm, next_scaled * c(float(_TWO_OVER_PI_DIGITS[j])), with_t, f"t{j}")

                # a division by 2**24 (exact), not a product with 2**-24: TVM's CUDA code generator
                # prints float64 literals with 15 decimals, and 2**-24 is not one of them
                return _let(tvm, scaled / c(float(1 << _DIGIT_BITS)), with_scaled, f"u{j}")

            total = parts[0]
            for part in parts[1:]:
                total = total + part

            def with_n(n: Any) -> Any:
                remainder = parts[0] - n
                for part in parts[1:]:
                    remainder = remainder + part

                def with_theta(theta: Any) -> Any:
                    def with_square(square: Any) -> Any:
                        sine = _horner(tvm, square, _SIN_TAYLOR, "float64") * theta
                        cosine = _horner(tvm, square, _COS_TAYLOR, "float64")
                        # NaN (from +-inf) makes n NaN: a quadrant of 0 keeps the int conversion defined
                        quadrant = tirx.floormod(tirx.Select(tirx.isnan(n), c(0.0), n).astype("int32"), 4)
                        return tirx.Select(
                            quadrant == 0,
                            sine,
                            tirx.Select(quadrant == 1, cosine, tirx.Select(quadrant == 2, -sine, -cosine)),
                        )

                    return _let(tvm, theta * theta, with_square, "t2")

                return _let(tvm, remainder * c(math.pi / 2), with_theta, "theta")

            return _let(tvm, tirx.round(total), with_n, "n")

        return with_parts([], wide)

    def with_x(x: Any) -> Any:
        reduced_sin = _let(tvm, x.astype("float64"), with_wide, "w").astype(dtype)
        return tirx.Select(tirx.abs(x) < tirx.const(2.0**-12, dtype), x, reduced_sin)

    return _let(tvm, x, with_x, "x")


def _rational(tvm: Any, x: Any, bound: float, alpha: tuple[float, ...], beta: tuple[float, ...], dtype: str) -> Any:
    """``x p(x**2) / q(x**2)`` for ``x`` clamped to ``[-bound, bound]``; NaN selected through (the
    clamp turns it into a number on either target)."""

    def with_x(x: Any) -> Any:
        return _let(tvm, x * x, lambda x2: x * _horner(tvm, x2, alpha, dtype) / _horner(tvm, x2, beta, dtype), "x2")

    def guarded(raw: Any) -> Any:
        return tvm.tirx.Select(_is_nan(tvm, raw), raw, _let(tvm, _clamp(tvm, raw, -bound, bound, dtype), with_x, "x"))

    return _let(tvm, x, guarded, "q")


def fast_tanh(tvm: Any, x: Any, dtype: str) -> Any:
    """Eigen's rational tanh on [-9, 9] (tanh is +-1 to float32 precision outside), and ``x`` itself
    below 2**-13 (where x**3 / 3 is under half an ulp of x): the rational's ``x * p(x**2)`` falls into
    the subnormals there first and came out 100 ulps off near 1e-38."""
    tirx = tvm.tirx
    return _let(
        tvm,
        x,
        lambda x: tirx.Select(
            tirx.abs(x) < tirx.const(2.0**-13, dtype), x, _rational(tvm, x, 9.0, _TANH_ALPHA, _TANH_BETA, dtype)
        ),
        "h",
    )


def exp(tvm: Any, x: Any, dtype: str) -> Any:
    """``e**x`` (the fast form in float32)."""
    return fast_exp(tvm, x, dtype) if dtype in FAST_DTYPES else tvm.tirx.exp(x)


def sigmoid(tvm: Any, x: Any, dtype: str) -> Any:
    """``1 / (1 + e**-x)`` written with ``e = exp(-|x|)``, which never overflows: ``1 / (1 + e)`` for
    ``x >= 0``, ``e / (1 + e)`` below (the plain form overflows ``e**-x`` to inf for x < -88.7 and
    returns 0 where the answer is a subnormal). NaN: ``exp(NaN)`` is NaN and the select keeps it."""
    one = tvm.tirx.const(1.0, dtype)

    def with_x(x: Any) -> Any:
        def with_e(e: Any) -> Any:
            return _let(
                tvm,
                one / (one + e),
                lambda inverse: tvm.tirx.Select(x >= tvm.tirx.const(0.0, dtype), inverse, e * inverse),
                "s",
            )

        return _let(tvm, exp(tvm, -tvm.tirx.abs(x), dtype), with_e, "e")

    return _let(tvm, x, with_x, "x")


def fast_erf(tvm: Any, x: Any, dtype: str) -> Any:
    """Eigen's rational erf on [-4, 4] (erf is +-1 to float32 precision outside); NaN stays NaN."""
    return _rational(tvm, x, 4.0, _ERF_ALPHA, _ERF_BETA, dtype)


#: ``erfcx(z) = e**(z**2) erfc(z)`` on z in [0.3, 30] as a degree-14 polynomial in
#: ``t = (z - 2) / (z + 2)``, highest power first: a least-squares Chebyshev fit (numpy's chebfit on
#: 400 001 points against scipy.special.erfcx, converted to powers), relative error 1.0e-10
_ERFCX_POLY = (
    1.928104410155041e-06,
    3.237182272252414e-06,
    -1.1649893121134611e-05,
    -2.925917095491855e-05,
    2.6131517302229862e-05,
    0.0001752121896462115,
    4.3999969283374426e-05,
    -0.0009822114638755653,
    -0.0008472181600581627,
    0.006997494778939791,
    0.0037328985103527597,
    -0.07897858305539872,
    0.24165819405421202,
    -0.4271858473777245,
    0.25539567631145793,
)
#: gelu's float32 form switches to ``x erfc(-x / sqrt 2) / 2`` below this x
_GELU_TAIL_FROM = -0.5  # z = 0.354, inside the fit
#: Taylor coefficients of e**r, highest first: 7e-15 on |r| <= ln 2 / 2
_EXP_TAYLOR = tuple(1 / math.factorial(k) for k in range(11, -1, -1))


def _exp_f64_nonpositive(tvm: Any, y: Any) -> Any:
    """float64 ``e**y`` for ``y`` in [-200, 0], vectorizable (LLVM calls libm once per element for the
    intrinsic): ``y = n ln2 + r`` (ln 2 in two parts), Taylor to r**11, ``2**n`` in the exponent bits."""
    tirx = tvm.tirx

    def c(value: float) -> Any:
        return tirx.const(value, "float64")

    def with_n(n: Any) -> Any:
        def with_r(r: Any) -> Any:
            scale = tirx.reinterpret("float64", (n.astype("int64") + tirx.const(1023, "int64")) << 52)
            return _horner(tvm, r, _EXP_TAYLOR, "float64") * scale

        return _let(tvm, y - n * c(0.693359375) - n * c(-2.121944400546905828e-4), with_r, "r")

    return _let(tvm, tirx.round(y * c(1.4426950408889634)), with_n, "n")


def _gelu_tail(tvm: Any, x: Any, dtype: str) -> Any:
    """float32 gelu for x below -0.5 as ``x erfc(z) / 2``, ``z = -x / sqrt 2``, ``erfc(z) = e**(-z**2)
    erfcx(z)`` (:data:`_ERFCX_POLY`), in float64 arithmetic that vectorizes: ``1 + erf`` cancels there."""
    tirx = tvm.tirx

    def c(value: float) -> Any:
        return tirx.const(value, "float64")

    def with_wide(wide: Any) -> Any:
        def with_z(z: Any) -> Any:
            # past z = 14 (x < -20) gelu is far below float32's subnormals: e**-200 keeps it at 0
            exponent = tirx.Select(z * z > c(200.0), c(-200.0), -(z * z))
            t = (z - c(2.0)) / (z + c(2.0))
            return wide * _exp_f64_nonpositive(tvm, exponent) * _horner(tvm, t, _ERFCX_POLY, "float64") * c(0.5)

        return _let(tvm, -wide * c(1 / math.sqrt(2)), with_z, "z")

    return _let(tvm, x.astype("float64"), with_wide, "w").astype(dtype)


def gelu(tvm: Any, x: Any, dtype: str) -> Any:
    """``x * (1 + erf(x / sqrt 2)) / 2``, the exact form (``F.gelu``'s default). float32: Eigen's
    rational erf from x = -0.5 up, :func:`_gelu_tail` below (``1 + erf`` cancels: 35 ulps at x = -2,
    gelu(-10) = -7.6e-23 came out -0); float64: the intrinsic ``erf``."""
    tirx = tvm.tirx

    def head(x: Any) -> Any:
        scaled = x * tirx.const(1 / math.sqrt(2), dtype)
        erf = fast_erf(tvm, scaled, dtype) if dtype in FAST_DTYPES else tirx.erf(scaled)
        # Phi(x) first: x * (1 + erf) overflows for x above FLT_MAX / 2
        return x * ((tirx.const(1.0, dtype) + erf) * tirx.const(0.5, dtype))

    if dtype not in FAST_DTYPES:
        return _let(tvm, x, head, "g")
    return _let(
        tvm, x, lambda x: tirx.Select(x < tirx.const(_GELU_TAIL_FROM, dtype), _gelu_tail(tvm, x, dtype), head(x)), "g"
    )


def relu(tvm: Any, x: Any, dtype: str) -> Any:
    """``max(x, 0)`` as ``torch.relu``: NaN stays NaN (TIR's ``max`` gives 0 on LLVM), -0 stays -0."""
    zero = tvm.tirx.const(0.0, dtype)
    return tvm.tirx.Select(x < zero, zero, x)


def _map_forms() -> dict[str, Callable[[Any, Any, str, float], Any]]:
    def wide_or(wide: Callable[[Any, Any, str], Any], exact: str) -> Callable[[Any, Any, str, float], Any]:
        return lambda tvm, x, dtype, by: wide(tvm, x, dtype) if dtype in FAST_DTYPES else getattr(tvm.tirx, exact)(x)

    return {
        "relu": lambda tvm, x, dtype, by: relu(tvm, x, dtype),
        "abs": lambda tvm, x, dtype, by: tvm.tirx.abs(x),
        "neg": lambda tvm, x, dtype, by: -x,
        "sin": wide_or(wide_sin, "sin"),
        "exp": lambda tvm, x, dtype, by: exp(tvm, x, dtype),
        "sigmoid": lambda tvm, x, dtype, by: sigmoid(tvm, x, dtype),
        "tanh": wide_or(fast_tanh, "tanh"),
        "gelu": lambda tvm, x, dtype, by: gelu(tvm, x, dtype),
        "scale": lambda tvm, x, dtype, by: x * tvm.tirx.const(by, dtype),
    }


#: Map's functions: ``form(tvm, x, dtype, by)`` -> the TIR expression of ``f(x)``
MAP_FORMS: dict[str, Callable[[Any, Any, str, float], Any]] = _map_forms()

#: Blend's operations: ``form(tvm, a, b)``; min and max propagate NaN as torch.minimum/maximum
BLEND_FORMS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "add": lambda tvm, a, b: a + b,
    "sub": lambda tvm, a, b: a - b,
    "mul": lambda tvm, a, b: a * b,
    "min": nan_min,
    "max": nan_max,
}

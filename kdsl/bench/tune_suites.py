"""The benchmark suites of ``kdsl bench tune --suite``: the seed papers' operators and shapes, as data.

One table, :data:`SUITES`: suite name -> cases ``(label, gallery operator, layer binding, source
paper)``. A case the language, a backend or a tuner cannot handle yet keeps its row with the reason
in :data:`NOT_EXPRESSIBLE` (or the error its operator raises at its layer), so the suite's output
lists it as "not expressible yet: why" instead of dropping it.

Sources (``/work/shared/papers``): OpEvo's appendix B (MM1-3, BMM1-3 from BERT, AlexNet's C1 and C2);
Gensor's Table IV (GEMM M1-M3, GEMV V1-V3, conv C1-C3, average pooling P1-P3) and Table V (the
unbalanced GEMMs); ALT's section 7.1 names nine single operators but evaluates each on "10 random
configurations" whose ranges the paper's text does not give, so its rows are representative shapes
of ours (ResNet-18's conv3_x and similar), marked ``ALT (shape ours)``.

>>> sorted(SUITES)
['alt', 'gensor', 'opevo', 'smoke']
>>> [case.label for case in suite_cases("opevo")][:4]
['MM1', 'MM2', 'MM3', 'BMM1']
>>> suite_cases("nope")
Traceback (most recent call last):
...
kdsl.lang.errors.KdslError: unknown suite 'nope'; the suites are alt, gensor, opevo, smoke, all
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from kdsl import gallery, solve
from kdsl.codegen.native import has_native
from kdsl.lang.errors import KdslError


class SuiteCase(NamedTuple):
    """One benchmark case: a gallery operator at a layer binding, and the paper it comes from."""

    label: str
    operator: str
    layer: Mapping[str, int]
    paper: str


def _mm(label: str, m: int, k: int, n: int, paper: str) -> SuiteCase:
    """A GEMM ``[m, k] @ [k, n]`` as the gallery's ``matmul`` (``Cin`` the reduced dim)."""
    return SuiteCase(label, "matmul", {"M": m, "Cin": k, "Cout": n}, paper)


def _gemv(label: str, m: int, n: int) -> SuiteCase:
    """Gensor's GEMV ``MN=[m, n]``: a matrix ``[m, n]`` times a vector of ``n``, as ``linear`` with one
    row (its weight ``[Cout, Cin]`` is the matrix)."""
    return SuiteCase(label, "linear", {"N": 1, "Cin": n, "Cout": m}, "Gensor Table IV")


def _pool(label: str, n: int, c: int, size: int, window: int, stride: int) -> SuiteCase:
    """Gensor's average pooling of ``[n, c, size, size]`` (window F, stride S, no padding) as the
    gallery's ``avg_pool2d_strided``, with the output size PyTorch's floor gives."""
    out = (size - window) // stride + 1
    layer = {"N": n, "Cin": c, "H": size, "W": size, "Ho": out, "Wo": out, "K": window, "s": stride}
    return SuiteCase(label, "avg_pool2d_strided", layer, "Gensor Table IV")


_CONV3 = {"N": 1, "Cin": 128, "Cout": 128, "H": 28, "W": 28}  # ResNet-18's conv3_x

#: suite -> its cases, in the papers' order. Layer bindings give every primary variable and the
#: coefficients that differ from the operator's defaults.
SUITES: dict[str, tuple[SuiteCase, ...]] = {
    "opevo": (
        _mm("MM1", 512, 1024, 1024, "OpEvo B.1"),
        _mm("MM2", 512, 1024, 4096, "OpEvo B.1"),
        _mm("MM3", 512, 4096, 1024, "OpEvo B.1"),
        SuiteCase("BMM1", "bmm", {"B": 960, "M": 128, "K": 128, "N": 64}, "OpEvo B.2"),
        SuiteCase("BMM2", "bmm_tn", {"B": 960, "M": 128, "K": 128, "N": 64}, "OpEvo B.2"),
        SuiteCase("BMM3", "bmm_tn", {"B": 960, "M": 64, "K": 128, "N": 64}, "OpEvo B.2"),
        SuiteCase(
            "C1",
            "alexnet_c1",
            {"N": 512, "Cin": 3, "Cout": 64, "H": 227, "W": 227, "Ho": 55, "Wo": 55, "K": 11, "s": 4},
            "OpEvo B.3",
        ),
        SuiteCase("C2", "conv2d", {"N": 512, "Cin": 64, "Cout": 192, "H": 27, "W": 27, "K": 5}, "OpEvo B.3"),
    ),
    "alt": (
        SuiteCase("C1D", "conv1d", {"N": 1, "Cin": 256, "Cout": 256, "L": 512, "K": 3}, "ALT (shape ours)"),
        SuiteCase("C2D", "conv2d", {**_CONV3, "K": 3}, "ALT (shape ours)"),
        SuiteCase(
            "C3D", "conv3d", {"N": 1, "Cin": 64, "Cout": 64, "D": 8, "H": 28, "W": 28, "K": 3}, "ALT (shape ours)"
        ),
        SuiteCase("GRP", "grouped_conv2d", {**_CONV3, "G": 4, "K": 3}, "ALT (shape ours)"),
        SuiteCase("DEP", "depthwise_conv2d", {"N": 1, "Cin": 128, "H": 28, "W": 28, "K": 3}, "ALT (shape ours)"),
        SuiteCase("DIL", "dilated_conv2d", {**_CONV3, "K": 3, "d": 2}, "ALT (shape ours)"),
        _mm("GMM", 1024, 1024, 1024, "ALT (shape ours)"),
        SuiteCase("T2D", "conv_transpose2d", {"N": 1, "Cin": 256, "Cout": 128, "H": 14, "W": 14}, "ALT (shape ours)"),
        SuiteCase(
            "T3D", "conv_transpose3d", {"N": 1, "Cin": 128, "Cout": 64, "D": 8, "H": 16, "W": 16}, "ALT (shape ours)"
        ),
    ),
    "gensor": (
        _mm("M1", 8192, 8192, 8192, "Gensor Table IV"),
        _mm("M2", 65536, 4, 1024, "Gensor Table IV, V"),
        _mm("M3", 65536, 1024, 4096, "Gensor Table IV"),
        _mm("U2", 32768, 64, 2048, "Gensor Table V"),
        _mm("U3", 16384, 32, 1024, "Gensor Table V"),
        _gemv("V1", 16384, 16384),
        _gemv("V2", 16384, 8192),
        _gemv("V3", 16384, 1000),
        SuiteCase(
            "C1",
            "alexnet_c1",
            {"N": 128, "Cin": 256, "Cout": 256, "H": 30, "W": 30, "Ho": 14, "Wo": 14, "K": 3, "s": 2},
            "Gensor Table IV (no padding)",
        ),
        SuiteCase(
            "C2",
            "conv2d",
            {"N": 128, "Cin": 128, "Cout": 128, "H": 28, "W": 28, "K": 3},
            "Gensor Table IV (pad ours: same)",
        ),
        SuiteCase(
            "C3",
            "alexnet_c1",
            {"N": 128, "Cin": 128, "Cout": 128, "H": 58, "W": 58, "Ho": 28, "Wo": 28, "K": 3, "s": 2},
            "Gensor Table IV (no padding)",
        ),
        SuiteCase("P1", "avg_pool2d", {"N": 16, "Cin": 48, "H": 48, "W": 48, "K": 2}, "Gensor Table IV"),
        # 83 = 2*41 + 1: PyTorch's floor drops the last row and column; P3's windows overlap (K=3, s=2)
        _pool("P2", 128, 168, 83, 2, 2),
        _pool("P3", 128, 617, 21, 3, 2),
    ),
    # not a paper's: one small matmul, to check the plumbing in a minute (tests run it)
    "smoke": (_mm("MM-tiny", 64, 64, 64, "none (plumbing check)"),),
}

#: (suite, label) -> why the case cannot run yet, where its operator does not say so by itself (none
#: now: ALT's C3D runs as ``conv3d``, Gensor's P2 and P3 as ``avg_pool2d_strided``).
NOT_EXPRESSIBLE: dict[tuple[str, str], str] = {}


def suite_names() -> list[str]:
    """The suites ``--suite`` takes, ``all`` last (every paper's suite; not ``smoke``).

    >>> suite_names()
    ['alt', 'gensor', 'opevo', 'smoke', 'all']
    """
    return [*sorted(SUITES), "all"]


def suite_cases(name: str) -> list[SuiteCase]:
    """The cases of suite ``name`` (``all``: the papers' suites in the order opevo, alt, gensor)."""
    if name == "all":
        return [case for suite in ("opevo", "alt", "gensor") for case in SUITES[suite]]
    if name not in SUITES:
        raise KdslError(f"unknown suite {name!r}; the suites are {', '.join(suite_names())}")
    return list(SUITES[name])


def suite_of(case: SuiteCase) -> str:
    """The suite a case belongs to (labels repeat across suites: Gensor's C1 is not OpEvo's).

    >>> suite_of(suite_cases("gensor")[0])
    'gensor'
    """
    for name, cases in SUITES.items():
        if case in cases:
            return name
    raise KdslError(f"the case {case.label!r} is in no suite")


def blocked_reason(case: SuiteCase) -> str | None:
    """Why ``case`` cannot be tuned and measured yet, or ``None`` when it can: a reason of
    :data:`NOT_EXPRESSIBLE`, else the error of loading its operator or binding it to its layer.

    >>> blocked_reason(suite_cases("opevo")[0]) is None, blocked_reason(suite_cases("gensor")[-1]) is None
    (True, True)
    """
    reason = NOT_EXPRESSIBLE.get((suite_of(case), case.label))
    if reason:
        return reason
    try:
        op = gallery.load(case.operator)
        solve.shapes(op, solve.bind(op, case.layer))
    except KdslError as error:
        return f"{case.operator} at {dict(case.layer)}: {str(error).splitlines()[0]}"
    return None


def baseline_reason(case: SuiteCase) -> str | None:
    """Why PyTorch has no baseline for ``case``'s operator, or ``None`` when it has one.

    >>> baseline_reason(suite_cases("opevo")[3]) is None  # BMM1: torch.bmm
    True
    """
    if not has_native(case.operator):
        return f"no native PyTorch function for {case.operator} in kdsl.codegen.native"
    return None

"""The kdsl language: sizes, dims, the eight linear primitives, Canvas's non-linear ones and the
joins of branches, operators and branching kernels, text and JSON.

``from kdsl.lang import *`` gives exactly the names a DSL program uses.
"""

from kdsl.lang.branches import Blend, Product, Tensor
from kdsl.lang.build import Builder, Input, Output, Pipeline
from kdsl.lang.errors import (
    AmbiguousDimError,
    DivisibilityError,
    KdslError,
    LayerError,
    LoweringError,
    ParseError,
    ShapeError,
    SizeError,
    UnboundDimError,
    ValidityError,
)
from kdsl.lang.nonlinear import FC, Fold, Map, Rename, Softmax
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse, parse_size
from kdsl.lang.primitives import Dilate, Dim, Expand, Merge, Reduce, Share, Shift, Slide, Split, Stride, Unfold, Weight
from kdsl.lang.serialize import from_json
from kdsl.lang.sizes import Size, coefficient, dynamic, primary, unify

__all__ = [
    "FC",
    "Blend",
    "Dilate",
    "Dim",
    "Expand",
    "Fold",
    "Map",
    "Product",
    "Rename",
    "Softmax",
    "Input",
    "Merge",
    "Output",
    "Reduce",
    "Share",
    "Shift",
    "Split",
    "Slide",
    "Stride",
    "Unfold",
    "Weight",
    "coefficient",
    "dynamic",
    "primary",
]

# Also importable by name (not part of `import *`, which gives the DSL's own vocabulary).
_PUBLIC = [
    AmbiguousDimError,
    Builder,
    DivisibilityError,
    KdslError,
    LayerError,
    LoweringError,
    Operator,
    ParseError,
    Pipeline,
    ShapeError,
    Size,
    SizeError,
    Tensor,
    UnboundDimError,
    ValidityError,
    from_json,
    parse,
    parse_size,
    unify,
]

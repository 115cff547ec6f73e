"""The kdsl language: sizes, dims, the eight primitives, operators, text and JSON.

``from kdsl.lang import *`` gives exactly the names a DSL program uses.
"""

from kdsl.lang.build import Builder, Input, Operator, Output, Pipeline
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
from kdsl.lang.parser import parse, parse_size
from kdsl.lang.primitives import Dim, Expand, Merge, Reduce, Share, Shift, Split, Stride, Unfold, Weight
from kdsl.lang.serialize import from_json
from kdsl.lang.sizes import Size, coefficient, primary

__all__ = [
    "Dim",
    "Expand",
    "Input",
    "Merge",
    "Output",
    "Reduce",
    "Share",
    "Shift",
    "Split",
    "Stride",
    "Unfold",
    "Weight",
    "coefficient",
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
    UnboundDimError,
    ValidityError,
    from_json,
    parse,
    parse_size,
]

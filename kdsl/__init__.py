"""kdsl: an embedded Python DSL for neural tensor operators.

>>> import kdsl
>>> from kdsl.lang import *
>>> N, Cin, Cout, H, W = primary("N Cin Cout H W"); K = coefficient("K")
>>> conv = (Input(N, Cin, H, W) >> Unfold(H, K, "kh") >> Unfold(W, K, "kw")
...         >> Share(Weight(Cout, Cin, "kh", "kw", name="w")) >> Reduce(Cin, "kh", "kw")
...         >> Output(N, Cout, H, W, defaults={"K": 3}))
>>> kdsl.parse(conv.to_dsl()) == conv
True

``import kdsl`` loads neither torch nor tvm; the backends load them on first use.
"""

import importlib

# the DSL's vocabulary is lang's (`from kdsl.lang import *`), declared once in kdsl.lang.__all__
from kdsl.lang import *  # noqa: F403
from kdsl.lang import __all__ as _DSL_NAMES
from kdsl.lang.build import Pipeline
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse
from kdsl.lang.serialize import from_json

__version__ = "0.1.0"

#: subpackages that ``kdsl.<name>`` loads on first use (PEP 562), so ``import kdsl`` stays light
#: (no torch, no tvm) and ``kdsl.gallery.load("conv2d")`` still works without importing them first
_SUBPACKAGES = frozenset(
    {"bench", "cli", "codegen", "discover", "gallery", "lang", "nn", "runtime", "search", "solve", "testing", "tune"}
)


def __getattr__(name: str) -> object:
    """Load a subpackage on first access: ``kdsl.gallery``, ``kdsl.solve``, ...

    >>> import kdsl
    >>> kdsl.gallery.load("conv2d").key == kdsl.parse(kdsl.gallery.load("conv2d").to_dsl()).key
    True
    """
    if name in _SUBPACKAGES:
        return importlib.import_module(f"kdsl.{name}")
    raise AttributeError(f"module 'kdsl' has no attribute {name!r}")


__all__ = [*_DSL_NAMES, "KdslError", "Operator", "Pipeline", "from_json", "parse"]

"""Operator search: synthesize operators bottom-up from a spec, canonicalize them, and store them.

>>> from kdsl.search import Space, search
>>> report = search(Space("matmul", "resnet18", max_depth=2, caps={"Shift": 0, "Expand": 0}))
>>> report.finished, report.valid
(True, 1)
"""

from kdsl.lang.errors import SearchError
from kdsl.search.run import STRATEGIES, Report, search
from kdsl.search.space import SPECS, Space, Spec, load_spec, parse_budget

__all__ = ["SPECS", "STRATEGIES", "Report", "SearchError", "Space", "Spec", "load_spec", "parse_budget", "search"]

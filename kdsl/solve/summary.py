"""What :func:`kdsl.solve.check` gives a user: the check's report, printable as the table that
``kdsl check`` prints (per layer: coefficients, input and output shapes, cost, parameters).

:mod:`.constraints` checks and :mod:`.cost` counts; this module joins the two, so neither has to
import the other's caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from kdsl.lang.operator import Operator
from kdsl.solve.constraints import CheckReport
from kdsl.solve.constraints import check as check_constraints
from kdsl.solve.cost import cost, shapes

__all__ = ["CheckSummary", "check"]


@dataclass(frozen=True)
class CheckSummary(CheckReport):
    """A :class:`~kdsl.solve.constraints.CheckReport` that knows its operator: ``str(report)`` is a
    table of the layers (cost in MACs, multiply-accumulates; a branching kernel's element-wise operations
    count as one MAC each, so that every count kdsl prints has the one unit)."""

    op: Operator | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        if self.op is None:
            return repr(self)
        unit = "M MACs"
        coefficients = list(self.op.coefficient_variables)
        rows = [["layer", *coefficients, "input", "output", unit, "params"]]
        for index, (layer, binding) in enumerate(self):
            padding = self.paddings[index] if index < len(self.paddings) else None
            if padding is not None:  # the shapes the caller passes and gets, the padded costs
                dims = {"input": padding.input_shape, "output": padding.output_shape}
                binding = padding.padded_binding
            else:
                dims = shapes(self.op, binding)
            costs = cost(self.op, binding)
            rows.append(
                [
                    layer.name,
                    *(str(binding[c]) for c in coefficients),
                    "x".join(map(str, dims["input"])),
                    "x".join(map(str, dims["output"])),
                    f"{costs['flops'] / 1e6:.2f}",
                    str(costs["params"]),
                ]
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [f"valid on {len(self)} layers" + (" (padded where the paddings say)" if any(self.paddings) else "")]
        for row in rows:
            cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
            lines.append("  " + "  ".join(cells))
        return "\n".join(lines)


def check(
    op: Operator,
    layers: object,
    coefficients: Mapping[str, int] | None = None,
    *,
    allow_large_windows: bool = False,
    pad: bool = False,
) -> CheckSummary:
    """:func:`kdsl.solve.constraints.check` (same arguments, same errors), returning a report that
    prints as a table.

    >>> from kdsl.lang import library
    >>> print(check(library.load("conv2d"), "resnet18"))
    valid on 4 layers
      layer    K        input       output  M MACs   params
      conv2_x  3   1x64x56x56   1x64x56x56  115.61    36864
      conv3_x  3  1x128x28x28  1x128x28x28  115.61   147456
      conv4_x  3  1x256x14x14  1x256x14x14  115.61   589824
      conv5_x  3    1x512x7x7    1x512x7x7  115.61  2359296
    """
    report = check_constraints(op, layers, coefficients, allow_large_windows=allow_large_windows, pad=pad)
    return CheckSummary(**{f.name: getattr(report, f.name) for f in fields(report)}, op=op)

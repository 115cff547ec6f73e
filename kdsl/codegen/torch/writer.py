"""The PyTorch backend's writer: the lines of a forward and the data's dims while they are written.

:class:`_Writer` holds the lines of one linear chain's forward, the data's dims in order (by DSL
name), and what waits to be done to the data until a line reads it: Merges (fused into one view
or copy) and a layout (a convolution's grouped output, a Split) that a Merge back makes free.
Every rearrangement goes through :func:`~kdsl.codegen.torch.views.rearrange_code`, so the forward
calls ``reshape``/``permute`` with shapes worked out here. The view rules and stages
(:mod:`kdsl.codegen.torch.chain_lowering`) and the native fast paths
(:mod:`kdsl.codegen.torch.fast_paths`) write through it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kdsl.codegen.torch.views import rearrange_code
from kdsl.lang.primitives import Shift, Weight
from kdsl.lang.sizes import Size


def _size_code(size: Size, identifiers: Mapping[str, str]) -> str:
    """Integer Python code for a size, in terms of the module's size variables."""
    numerator = [str(size.constant.numerator)] if size.constant.numerator != 1 else []
    denominator = [str(size.constant.denominator)] if size.constant.denominator != 1 else []
    for var, exponent in size.exponents:
        target = numerator if exponent > 0 else denominator
        target.extend([identifiers[var.name]] * abs(exponent))
    text = " * ".join(numerator) or "1"
    if denominator:
        below = " * ".join(denominator)
        text = f"{_atom(text)} // {_atom(below)}"
    return text


def _atom(code: str) -> str:
    """``code`` in parentheses unless it is one name or number (so it can follow ``//`` or ``-``)."""
    return code if re.fullmatch(r"\w+", code) else f"({code})"


@dataclass
class _Writer:
    """Lines of the forward and the data's dims (``axes``, in order). Merges are deferred and
    fused into one ``rearrange`` (``merged``: dim -> the physical dims it flattens), so a chain
    like Merge(Cin, kh), Merge(., kw) copies an unfolded tensor once, not once per Merge."""

    lines: list[str]
    axes: list[str]
    axis: Callable[[str], str]  # DSL dim name -> its axis name in patterns and comments
    identifiers: dict[str, str]  # size variable -> Python identifier
    merged: dict[str, list[str]] = field(default_factory=dict)
    physical: list[str] = field(default_factory=list)  # the tensor's real dims while merges wait
    current: str = "x"  # the variable holding the data now (a branching kernel's chain starts on its argument's)
    var: str = "x"  # the variable this chain writes
    weights: list[str] = field(default_factory=list)  # the code of each weight (``self.depthwise``)
    layout: tuple[str, dict[str, str]] | None = None  # the data's pattern and lengths while a split waits
    split_sizes: dict[str, Size] = field(default_factory=dict)  # a Split's inner dim -> its size

    @property
    def data(self) -> str:
        """The variable holding the data, for a line about to read it: waiting merges happen first."""
        self.flush()
        return self.current

    def weight(self, index: int) -> str:
        return self.weights[index]

    def size(self, size: Size) -> str:
        return _size_code(size, self.identifiers)

    def group(self, names: list[str]) -> str:
        return "(" + " ".join(self.axis(n) for n in names) + ")"

    def emit(self, line: str) -> None:
        self.flush()
        self.append(line)

    def append(self, line: str) -> None:
        if line.startswith(f"{self.var} = "):  # from now on the chain's own variable holds the data
            self.current = self.var
        self.lines.append(line)

    def move(self, source: str, target: str, lengths: Mapping[str, str] | None = None, comment: str = "") -> None:
        """Rearrange the data from the einops pattern ``source`` to ``target`` as torch views
        (:func:`~kdsl.codegen.torch.views.rearrange_code`; nothing where it changes nothing)."""
        code = rearrange_code(self.current, source, target, lengths or {})
        if code is not None:
            self.append(f"{self.var} = {code}  # {source} -> {target}{comment}")

    def _source(self) -> tuple[str, dict[str, str]]:
        """The einops pattern of the data as it lies (with its lengths): a convolution's output
        waits in its own grouping until a line reads the data (see :meth:`lay_out`)."""
        if self.layout is not None:
            return self.layout
        return self.pattern(self.physical if self.merged else None), {}

    def lay_out(self, pattern: str, lengths: dict[str, str]) -> None:
        """The data lies as ``pattern`` (groups of ``self.axes``, in order) until a line reads it:
        then one view splits the groups, or none where the next steps merge them back."""
        self.layout = (pattern, lengths)

    def flush(self) -> None:
        if not self.merged and self.layout is None:
            return
        source, lengths = self._source()
        target = " ".join(
            "(" + " ".join(self.axis(d) for d in self.merged[a]) + ")" if a in self.merged else self.axis(a)
            for a in self.axes
        )
        self.merged, self.layout = {}, None
        self.move(source, target, lengths)

    def reorder(self, axes: list[str]) -> None:
        """Permute the data's dims to ``axes`` (the same dims), in one copy with any waiting merges
        (a Merge after the last stage and the output's order are one reshape, not two)."""
        source, lengths = self._source()
        if self.merged:
            target = " ".join(
                "(" + " ".join(self.axis(d) for d in self.merged[a]) + ")" if a in self.merged else self.axis(a)
                for a in axes
            )
        else:
            target = self.pattern(axes)
        self.merged, self.layout = {}, None
        self.move(source, target, lengths)
        self.axes = list(axes)

    def merge(self, outer: str, inner: str, name: str) -> None:
        if not self.merged:
            self.physical = list(self.axes)  # a waiting layout groups these same dims
        position = self.axes.index(outer)
        flattened = self.merged.pop(outer, [outer]) + self.merged.pop(inner, [inner])
        rest = [a for a in self.axes if a not in (outer, inner)]
        insert_at = sum(1 for a in self.axes[:position] if a != inner)
        self.axes = rest[:insert_at] + [name] + rest[insert_at:]
        self.merged[name] = flattened

    def pattern(self, axes: list[str] | None = None) -> str:
        return " ".join(self.axis(a) for a in (self.axes if axes is None else axes))


def _rearrange(
    writer: _Writer, operand: str, source: str, target: str, lengths: Mapping[str, str] | None = None, comment: str = ""
) -> str:
    """Emit the rearrangement of ``operand`` (the data or a weight) from ``source`` to ``target``
    as torch views, unless it changes nothing; return the variable holding the result (the data's
    variable for the data, ``w`` for a weight)."""
    is_data = operand == writer.data
    name = writer.var if is_data else "w"
    code = rearrange_code(operand, source, target, lengths or {})
    if code is None:
        return operand
    writer.emit(f"{name} = {code}  # {source} -> {target}{comment}")
    return name


def _weight_lengths(writer: _Writer, weight: Weight) -> dict[str, str]:
    """Every dim's size of ``weight`` as code: its re-layout then reads no shapes at run time."""
    return {writer.axis(d.name): writer.size(d.size) for d in weight.dims}


def _shift(writer: _Writer, step: Shift) -> None:
    axis = writer.axes.index(step.dim)
    writer.emit(f"{writer.var} = torch.roll({writer.data}, shifts={-step.offset}, dims={axis})  # Shift({step.dim})")


def _rolls(writer: _Writer, shifts: list[Shift]) -> None:
    """Cyclic shifts of several dims of the data as one ``torch.roll`` (one copy, not one each)."""
    if len(shifts) == 1:
        _shift(writer, shifts[0])
        return
    data = writer.data
    offsets = ", ".join(str(-s.offset) for s in shifts)
    axes = ", ".join(str(writer.axes.index(s.dim)) for s in shifts)
    names = ", ".join(f"Shift({s.dim})" for s in shifts)
    writer.emit(f"{writer.var} = torch.roll({data}, shifts=({offsets}), dims=({axes}))  # {names}")

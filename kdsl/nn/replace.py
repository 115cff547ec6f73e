"""Swap an operator into any ``nn.Module``: :func:`replace` and its :class:`Report`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from kdsl.codegen.torch import build, load_torch
from kdsl.lang import library
from kdsl.lang.errors import KdslError, printable
from kdsl.lang.operator import Operator
from kdsl.nn.conv_fit import ConvSpec, Fit, fit

__all__ = ["Report", "replace"]

#: which convs to consider: a predicate on (qualified name, module), or the qualified names
Where = Callable[[str, Any], bool] | Collection[str] | None
#: coefficient values: one mapping for every conv, or a function of (qualified name, conv)
Coefficients = Mapping[str, int] | Callable[[str, Any], Mapping[str, int]] | None


@dataclass
class Report:
    """What :func:`replace` did: ``replaced`` and ``left`` are lists of ``(qualified name, text)``,
    the text saying what the conv was and what replaced it, or why it stayed."""

    operator: str
    replaced: list[tuple[str, str]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        total = len(self.replaced) + len(self.left)
        width = max((len(name) for name, _ in self.replaced + self.left), default=0)
        lines = [f"replaced {len(self.replaced)} of {total} Conv2d with {self.operator}"]
        lines += [f"  {name:<{width}}  {text}" for name, text in self.replaced]
        lines.append(f"left {len(self.left)}")
        lines += [f"  {name:<{width}}  {text}" for name, text in self.left]
        return "\n".join(lines)


def replace(
    model: Any,
    op: Operator | str,
    where: Where = None,
    *,
    coefficients: Coefficients = None,
    label: str | None = None,
) -> tuple[Any, Report]:
    """Replace, in place, every ``nn.Conv2d`` of ``model`` that ``op`` serves by ``op``'s module,
    and return ``(model, report)``.

    ``op`` is an :class:`~kdsl.lang.operator.Operator`, or a gallery name or ``.dsl``/``.json``
    file (:func:`kdsl.lang.library.load_operator`). An operator serves a conv when it maps the
    conv's input to its output reading the same input pixels (:func:`kdsl.nn.conv_fit.fit`): with
    its default ``K=3``, grouped_conv2d serves every same-padded stride-1 3x3 conv; strided_conv2d
    serves the stride-2 ones. Each replacement is built for the conv's channels (the batch and
    resolution are read from the input), with a bias where the conv had one, initialised as
    PyTorch initialises the equivalent layer (kaiming-uniform over its fan-in), on the conv's
    device and dtype and in its training mode.

    ``where`` picks the convs to consider: a predicate ``(name, module) -> bool`` or a collection
    of qualified names (``"layer1.0.conv1"``; a name that is no ``nn.Conv2d`` of ``model`` is a
    :class:`KdslError`); by default every one. ``coefficients`` override the operator's defaults
    (``{"G": 2}``), or are a function ``(name, conv) -> dict`` for values per conv (``lambda name,
    conv: {"K": conv.kernel_size[0]}``). A grouped conv sets ``G`` to its groups. ``label`` names
    the operator in the report (default: the name ``op`` was given by, else ``"the operator"``).

    A replaced module reads its batch and resolution from its input; an operator whose sizes must
    divide the resolution (a stride) raises a :class:`ShapeError` on an input they do not divide,
    where ``nn.Conv2d`` would round.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1))
    >>> model, report = replace(model, "grouped_conv2d", coefficients={"G": 1})
    >>> print(report)
    replaced 1 of 2 Conv2d with grouped_conv2d
      0  3x3 conv 3->8 -> grouped_conv2d (G=1, K=3), bias
    left 1
      2  1x1 conv 8->8: kernel 1x1, the operator's K is 3
    >>> tuple(model(torch.ones(2, 3, 5, 7)).shape)
    (2, 8, 5, 7)
    """
    torch = load_torch()
    if not isinstance(model, torch.nn.Module):
        raise KdslError(f"kdsl.nn.replace takes a torch.nn.Module, got {type(model).__name__}")
    if isinstance(op, str):
        label = op if label is None else label
        op = library.load_operator(op)
    if not isinstance(op, Operator):
        raise KdslError(f"kdsl.nn.replace takes an Operator or a gallery name, got {type(op).__name__}")
    report = Report(label or "the operator")
    convs = [(name, module) for name, module in model.named_modules() if isinstance(module, torch.nn.Conv2d)]
    chosen = _chosen(convs, where)
    fits: dict[tuple[ConvSpec, tuple[tuple[str, int], ...]], Fit] = {}
    swaps = []
    for name, conv in convs:
        spec = ConvSpec.of(conv)
        if name not in chosen:
            report.left.append((name, f"{spec.describe()}: not chosen by where="))
            continue
        values = _coefficients(op, coefficients, name, conv)
        key = (spec, tuple(sorted(values.items())))
        if key not in fits:
            fits[key] = fit(op, spec, values)
        found = fits[key]
        if not found.serves:
            report.left.append((name, f"{spec.describe()}: {'; '.join(found.reasons)}"))
            continue
        swaps.append((name, _module(op, found, conv)))
        shown = ", ".join(f"{k}={v}" for k, v in sorted(found.binding.items()) if k in op.coefficient_variables)
        report.replaced.append(
            (name, f"{spec.describe()} -> {report.operator}{f' ({shown})' if shown else ''}{', bias' * spec.bias}")
        )
    for name, module in swaps:
        if not name:
            return module, report  # the model is itself a conv
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, module)
    return model, report


def _chosen(convs: list[tuple[str, Any]], where: Where) -> set[str]:
    """The names of the convs ``where`` picks."""
    names = {name for name, _ in convs}
    if where is None:
        return names
    if callable(where):
        return {name for name, module in convs if where(name, module)}
    if isinstance(where, str) or not isinstance(where, Collection):
        raise KdslError(f"where= takes a predicate (name, module) -> bool or a list of module names, got {where!r}")
    unknown = sorted(set(where) - names)
    if unknown:
        shown = sorted(names)
        listed = ", ".join(shown[:8]) + (f", ... ({len(shown)} in all)" if len(shown) > 8 else "") if shown else "none"
        quoted = ", ".join(f"'{printable(name)}'" for name in unknown)
        raise KdslError(f"where= names {quoted}, no Conv2d of the model (its convs: {listed})")
    return set(where)


def _coefficients(op: Operator, coefficients: Coefficients, name: str, conv: Any) -> dict[str, int]:
    """The coefficient values given for one conv, checked against the operator's coefficients."""
    given = coefficients(name, conv) if callable(coefficients) else coefficients
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise KdslError(f"coefficients must be a dict like {{'G': 2}} (or a function giving one), got {given!r}")
    values = dict(given)
    for key, value in values.items():
        if key not in op.coefficient_variables:
            known = ", ".join(op.coefficient_variables) or "none"
            raise KdslError(
                f"coefficients: the operator has no coefficient {printable(key)} (its coefficients: {known})"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KdslError(f"coefficients: {key}={value!r} must be a positive integer")
    return values


def _module(op: Operator, found: Fit, conv: Any) -> Any:
    """The operator's module for one conv: built at the fit's binding, on the conv's device and
    dtype and in its training mode."""
    weight = conv.weight
    module = build(op, dict(found.binding), bias=conv.bias is not None)
    return module.to(device=weight.device, dtype=weight.dtype).train(conv.training)

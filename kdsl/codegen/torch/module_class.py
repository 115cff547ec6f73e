"""The module object: :func:`build` compiles :func:`~kdsl.codegen.torch.module_source.source` into a
class registered in ``sys.modules``, cached (:data:`CACHED_CLASSES`), whose instances pickle as the
recipe that regenerates it."""

from __future__ import annotations

import hashlib
import linecache
import sys
import types
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from kdsl import solve
from kdsl.codegen.torch.identifiers import _class_name
from kdsl.codegen.torch.layer_facts import class_name, weight_attributes
from kdsl.codegen.torch.module_signature import _known_binding
from kdsl.codegen.torch.module_source import module_identifiers, padded_source, source
from kdsl.lang.errors import LoweringError
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse
from kdsl.solve.constraints import Binding
from kdsl.solve.layers import Layer, as_layer
from kdsl.solve.padding import Padding


def load_torch() -> Any:
    try:
        import torch
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise LoweringError(
            f"the PyTorch backend needs torch ({error}); install it with: pip install torch==2.13.0 einops"
        ) from None
    return torch


def build(
    op: Operator,
    layer: Mapping[str, int],
    *,
    name: str | None = None,
    pad: bool = False,
    bias: bool = False,
) -> Any:
    """A ``torch.nn.Module`` computing ``op`` (an operator or a branching kernel) at the sizes of
    ``layer``: the class :func:`source` writes, with one parameter per weight named after it
    (``module.depthwise``; ``module.weights`` lists them in ``op.weights`` order) and, with
    ``bias=True``, a ``bias`` per output channel (the output dim named ``Cout``, else the second),
    initialised like ``nn.Conv2d``'s: with the fan-in of the last weight that has that dim (else of
    the last weight).

    Like ``torch.nn``'s layers: the one weight of an operator of one weight is ``module.weight``
    (:func:`weight_attributes`), so ``load_state_dict`` takes an ``nn.Conv2d``'s or ``nn.Linear``'s
    state dict of the same layout, and one saved under the weight's DSL name (``w``) too; the class
    is named after the gallery operator (``GroupedConv2d``; ``name`` overrides it); a
    convolution-like operator's module has ``in_channels``, ``out_channels``, ``kernel_size``,
    ``stride``, ``dilation`` and ``groups`` and a one-line repr like ``nn.Conv2d``'s
    (:mod:`kdsl.codegen.torch.layer_facts`). An operator of several weights keeps their DSL names
    (the gallery file's docstring says how each maps onto PyTorch's weights).

    Sizes the layer does not give are read from the input at each call where no weight depends on
    them (:func:`lazy_variables`: N, H, W of a convolution); a size a weight needs raises
    :class:`LayerError` naming it.

    With ``pad=True`` a size that does not divide the layer is padded (:mod:`kdsl.solve.padding`):
    the weights have the padded shapes, the forward takes and returns the layer's shapes (it
    zero-pads its input and crops its output), and ``module.padding`` records the padding.

    The module is an instance of a real class: its source is compiled into a module object
    registered in ``sys.modules`` as ``kdsl_generated_<key>_<hash of the source>`` (one per source,
    so ``torch.compile`` and tracebacks find it), and it pickles as data, not as a reference to that
    class: the operator's DSL text, the layer, ``name`` and ``pad``, plus the module's state (its
    ``__dict__``: parameters, hooks, training flag). Unpickling (``pickle``, ``copy.deepcopy``,
    ``torch.load(..., weights_only=False)``, in this process or a fresh one with kdsl installed)
    parses the DSL with :func:`kdsl.lang.parse` (which never runs code), regenerates the class and
    restores the state without initialising anything.

    >>> import torch
    >>> from kdsl.lang import library
    >>> layer = {"N": 1, "Cin": 64, "Cout": 64, "H": 7, "W": 7, "G": 3}
    >>> module = build(library.load("grouped_conv2d"), layer, pad=True)
    >>> [tuple(w.shape) for w in module.weights], tuple(module(torch.ones(1, 64, 7, 7)).shape)
    ([(3, 22, 22, 3, 3)], (1, 64, 7, 7))
    >>> module  # padded: no nn.Conv2d has 64 channels in 3 groups, so the repr lists the padded sizes
    GroupedConv2d(Cin=66, Cout=66, H=7, N=1, W=7, G=3, K=3)
    >>> print(module.padding.describe())
    Cin 64 -> 66 (Split(Cin, Cin/G))
    Cout 64 -> 66 (Share(w): the weight dim co: Cout/G)
    >>> module = build(library.load("depthwise_separable_conv2d"), {"Cin": 8, "Cout": 16}, bias=True)
    >>> list(module.state_dict()), module
    (['depthwise', 'pointwise', 'bias'], DepthwiseSeparableConv2d(Cin=8, Cout=16, K=3, bias=True))
    >>> tuple(module(torch.ones(2, 8, 5, 9)).shape)
    (2, 16, 5, 9)
    """
    load_torch()
    item = as_layer(layer)
    recipe = (op.to_dsl(), item.name, tuple(item.items), class_name(op) if name is None else name, pad)
    checked = layer if isinstance(layer, Binding) and layer.checked_for(op) and not pad else None
    code, padding, binding, cls = _generated(op, recipe, checked)
    variables = [v.name for v in op.variables]
    ids = module_identifiers(op)
    module = cls(**{ids[v]: binding[v] for v in variables if v in binding}, bias=bias)
    module.kdsl_source = code
    module.padding = padding
    module._kdsl_recipe = recipe
    _INSTANCES[cls.__module__].add(module)
    return module


#: (DSL text, layer name, layer items, class name, pad) -> what :func:`build` made of it, the most
#: recently used last; at most :data:`CACHED_CLASSES` of them.
_GENERATED: OrderedDict[tuple[Any, ...], tuple[str, Padding | None, dict[str, int], type]] = OrderedDict()

#: How many generated classes stay cached (and registered) while no module of theirs is alive.
#: A search builds thousands of candidates: their classes must not pile up in ``sys.modules``.
CACHED_CLASSES = 256

#: The name of each generated module registered in ``sys.modules`` -> the live modules of its class
#: (built or unpickled ones): it stays registered while one lives, for ``torch.compile``.
_INSTANCES: dict[str, weakref.WeakSet[Any]] = {}

#: Attributes :func:`_restore` sets again, so a pickled module's state leaves them out.
_DERIVED = ("kdsl_source", "padding", "_kdsl_recipe")


def _generated(
    op: Operator, recipe: tuple[Any, ...], checked: Binding | None = None
) -> tuple[str, Padding | None, dict[str, int], type]:
    """The source, padding, binding and class of ``op`` built by ``recipe`` (cached); ``checked`` is
    the solver's binding of the recipe's layer when the caller has it (not solved again)."""
    found = _GENERATED.get(recipe)
    if found is not None:
        _GENERATED.move_to_end(recipe)
        return found
    _, layer_name, items, name, pad = recipe
    layer = Layer(layer_name, items)
    padding = solve.pad_binding(op, layer) if pad else None
    if padding is not None:
        binding = padding.padded_binding
    else:
        binding = checked if checked is not None else _known_binding(op, layer)
    code = padded_source(op, padding, name=name) if padding is not None else source(op, binding, name=name)
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    module_name = f"kdsl_generated_{op.key}_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        module = types.ModuleType(module_name)
        filename = f"<{module_name}>"
        # The code is generated by kdsl from a validated operator (names are identifiers, sizes are
        # integers), never user text, so compiling it is safe.
        exec(compile(code, filename, "exec"), module.__dict__)
        linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)  # tracebacks
        cls = module.__dict__[_class_name(name)]
        cls.__reduce_ex__ = _reduce_ex
        cls._load_from_state_dict = _load_from_state_dict
        cls.__setstate__ = _setstate
        # attribute -> the weight's DSL name where they differ: a state dict saved under the DSL name loads
        cls._kdsl_weight_names = {a: w.name for a, w in zip(weight_attributes(op), op.weights) if a != w.name}
        sys.modules[module_name] = module  # importable by name: torch.compile looks classes up there
        _INSTANCES[module_name] = weakref.WeakSet()
    found = (code, padding, dict(binding), getattr(module, _class_name(name)))
    _GENERATED[recipe] = found
    if len(_GENERATED) > CACHED_CLASSES:
        _forget_unused()
    return found


def _forget_unused() -> None:
    """Drop the least recently used classes past :data:`CACHED_CLASSES`, and unregister every
    generated module that neither the cache nor a live module uses (they are made again on demand)."""
    while len(_GENERATED) > CACHED_CLASSES:
        _GENERATED.popitem(last=False)
    cached = {cls.__module__ for *_, cls in _GENERATED.values()}
    for module_name, instances in list(_INSTANCES.items()):
        if module_name not in cached and not instances:
            del _INSTANCES[module_name]
            sys.modules.pop(module_name, None)
            linecache.cache.pop(f"<{module_name}>", None)


def _load_from_state_dict(module: Any, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
    """Load a state dict, taking a weight's DSL name for its attribute (``w`` of the gallery's conv2d
    for ``weight``: a state dict saved before the one weight was named ``weight`` loads), and a
    convolution-like module's ``weight`` in ``nn.Conv``'s shape ``[out_channels,
    in_channels/groups, *kernel_size]`` as its own, reshaped (:func:`~.layer_facts.nn_layer` checked
    that the elements are in the same order: ``grouped_conv2d``'s ``[G, Cout/G, Cin/G, kh, kw]``,
    ``depthwise_conv2d``'s ``[Cin, kh, kw]``). A weight of another shape is refused by PyTorch's own
    size check."""
    for attribute, dsl_name in getattr(module, "_kdsl_weight_names", {}).items():
        if prefix + dsl_name in state_dict and prefix + attribute not in state_dict:
            state_dict[prefix + attribute] = state_dict.pop(prefix + dsl_name)
    given, own = state_dict.get(prefix + "weight"), module._parameters.get("weight")
    if given is not None and own is not None and hasattr(module, "in_channels") and hasattr(given, "shape"):
        layout = (module.out_channels, module.in_channels // module.groups, *module.kernel_size)
        if tuple(given.shape) == layout and tuple(given.shape) != tuple(own.shape):
            state_dict[prefix + "weight"] = given.reshape(own.shape)
    load_torch().nn.Module._load_from_state_dict(module, state_dict, prefix, *args, **kwargs)


def _setstate(module: Any, state: dict[str, Any]) -> None:
    """Unpickle a module's state; a module pickled before its one weight was named ``weight``
    (its parameter under the DSL name, ``w``) gets it under ``weight``, in the same place."""
    renamed = {dsl_name: attribute for attribute, dsl_name in getattr(module, "_kdsl_weight_names", {}).items()}
    parameters = state.get("_parameters")
    if isinstance(parameters, dict) and any(name in renamed for name in parameters):
        state = {**state, "_parameters": {renamed.get(name, name): p for name, p in parameters.items()}}
    load_torch().nn.Module.__setstate__(module, state)


def _reduce_ex(module: Any, protocol: int) -> tuple[Any, ...]:
    """Pickle a built module as the recipe that regenerates its class and its state (see :func:`build`)."""
    state = {key: value for key, value in module.__dict__.items() if key not in _DERIVED}
    return (_restore, (module._kdsl_recipe,), state)


def _restore(recipe: tuple[Any, ...]) -> Any:
    """A module of ``recipe``'s class, not initialised: unpickling then sets its state."""
    load_torch()
    found = _GENERATED.get(recipe)
    code, padding, _, cls = found if found is not None else _generated(parse(recipe[0]), recipe)
    module = cls.__new__(cls)
    module.__dict__.update(kdsl_source=code, padding=padding, _kdsl_recipe=recipe)
    _INSTANCES[cls.__module__].add(module)
    return module

"""The PyTorch backend: readable ``nn.Module`` source, top-down views and one einsum per stage.

:func:`source` writes a self-contained Python module (it imports only torch) whose code reads
like the DSL: each view is a ``reshape``/``permute`` or a small torch call, commented with the
einops pattern it does in the DSL's own dim names, and each contraction stage of the operator's
plan (:func:`kdsl.solve.plan`, Syno's rfactor) is one ``torch.einsum``. The shapes and permutations
are worked out when the source is written (:mod:`kdsl.codegen.torch.views`), not per call: on a GPU
at small sizes a forward's Python and its count of aten operators cost as much as the kernels. A
stage that is exactly a native op (a convolution of any kind: grouped, depthwise, strided, dilated;
1-D to 3-D; a matrix product; average pooling; ``F.unfold``) is lowered to it instead — same
numerics, faster — with its padding folded in and its weight re-laid out by views only. (A weight
whose layout needs a copy, as a search-found one might, is copied on each call: a cache keyed on
the parameter's version would have to follow ``.to()``, ``load_state_dict`` and in-place optimizer
steps, and under autograd the copy is part of the graph anyway; a small weight's copy is one
kernel.) :func:`build` compiles that source into a module for one layer that
behaves like a ``torch.nn`` one: the one weight of a convolution-like operator is ``weight`` and its
module has ``nn.Conv2d``'s attributes and repr (:mod:`~kdsl.codegen.torch.layer_facts`), other
parameters carry the DSL's weight names; they are initialised with
the fan-in PyTorch uses for the equivalent layer (:func:`fan_ins`), sizes no weight needs are read
from the input (:func:`lazy_variables`), ``bias=True`` adds a bias, and the module pickles,
deep-copies, saves whole with ``torch.save`` and compiles with ``torch.compile`` (see :func:`build`).

**Branching operators.** A branching operator's forward computes one variable per node (``x3`` is
node 3), one rule per node kind (:data:`GRAPH_RULES`). Each chain node is lowered as above on its
argument's variable (a linear operator's forward is its one chain, written without node variables);
the Canvas steps become torch calls: ``torch.relu`` and friends, ``F.softmax``, ``F.linear``, a 1x1
convolution or a ``torch.einsum``, broadcasting views for blends (every view is a ``reshape`` or
``permute`` worked out when the code is written, :mod:`kdsl.codegen.torch.views`: on a GPU at small
sizes the Python of each call costs as much as the kernels). A max (min) fold over the windows
of a chain that is only Unfold (+ Stride) and Split views is ``F.max_pool{1,2,3}d`` with that
padding; a fold of any other windowed chain ignores the windows' zero padding through a mask: the
chain run on ones (with weights of ones) is positive exactly where an element reads data.

**Files.** :mod:`~kdsl.codegen.torch.module_source` writes the module's text,
:mod:`~kdsl.codegen.torch.module_class` makes it a class (:func:`build`, its cache, pickling),
:mod:`~kdsl.codegen.torch.module_signature` says what its constructor takes (fan-ins, lazy
sizes), :mod:`~kdsl.codegen.torch.layer_facts` what torch.nn would call its weight, attributes and
class; :mod:`~kdsl.codegen.torch.chain_lowering` lowers a linear chain through
:mod:`~kdsl.codegen.torch.writer` and :mod:`~kdsl.codegen.torch.views`, with the native ops of
:mod:`~kdsl.codegen.torch.fast_paths`; :mod:`~kdsl.codegen.torch.graph_nodes` holds a branching
operator's node rules; :mod:`~kdsl.codegen.torch.identifiers` the names the generated code uses.

>>> import torch
>>> from kdsl.lang import *
>>> N, Cin, Cout = primary("N Cin Cout")
>>> linear = Input(N, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(N, Cout)
>>> module = build(linear, {"Cin": 3, "Cout": 4})
>>> module(torch.ones(2, 3)).shape
torch.Size([2, 4])
>>> [(name, tuple(p.shape)) for name, p in module.named_parameters()]  # torch.nn's name for a layer's weight
[('weight', (4, 3))]
>>> module
Linear(in_features=3, out_features=4)
>>> from kdsl.lang import *
>>> N, C, H, W = primary("N C H W")
>>> pool = Input(N, C, H, W) >> Unfold(H, 3, "kh") >> Unfold(W, 3, "kw") >> Fold("kh", "kw") >> Output(N, C, H, W)
>>> text = source(pool)
>>> for line in text[text.index("# node 1") : text.rindex("if self.bias")].splitlines():
...     print(line.strip())
# node 1: chain Unfold(H, 3) >> Unfold(W, 3) of node 0 -> [N, C, H, W, kh, kw] (pooled natively below, never computed)
# node 2: Fold(kh, kw, how=max) of node 1 -> [N, C, H, W]
x2 = _pool(x, "max", (3, 3), (1, 1), ((1, 1), (1, 1)))
<BLANKLINE>
"""

from kdsl.codegen.torch.chain_lowering import RULES
from kdsl.codegen.torch.graph_nodes import (
    BLEND_CODE,
    GRAPH_HELPERS,
    GRAPH_RULES,
    MAP_CODE,
    ChainEmitter,
    forward_lines,
    masked_folds,
    own_names,
)
from kdsl.codegen.torch.identifiers import MODULE_NAMES, NN_MODULE_ATTRIBUTES, OWN_NAMES, RESERVED_ATTRIBUTES
from kdsl.codegen.torch.layer_facts import NnLayer, class_name, nn_layer, weight_attributes
from kdsl.codegen.torch.module_class import build, load_torch
from kdsl.codegen.torch.module_signature import fan_ins, free_inputs, lazy_variables
from kdsl.codegen.torch.module_source import ERROR_IMPORT, HELPERS, padded_source, source

__all__ = [
    "BLEND_CODE",
    "ERROR_IMPORT",
    "GRAPH_HELPERS",
    "GRAPH_RULES",
    "HELPERS",
    "MAP_CODE",
    "MODULE_NAMES",
    "NnLayer",
    "NN_MODULE_ATTRIBUTES",
    "OWN_NAMES",
    "RESERVED_ATTRIBUTES",
    "RULES",
    "ChainEmitter",
    "build",
    "class_name",
    "fan_ins",
    "forward_lines",
    "free_inputs",
    "lazy_variables",
    "load_torch",
    "masked_folds",
    "nn_layer",
    "own_names",
    "padded_source",
    "source",
    "weight_attributes",
]

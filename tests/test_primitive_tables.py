"""Every primitive is declared once in kdsl.lang and has one entry in every table that lowers,
renders, checks or searches it: adding a primitive fails here until each table has its rule."""

import numpy as np
import pytest

import kdsl
from kdsl.codegen import reference, render
from kdsl.codegen import torch as kdsl_torch
from kdsl.codegen import tvm as kdsl_tvm
from kdsl.lang import FC, Blend, Fold, Input, Map, Output, Product, Rename, Softmax, Unfold, index
from kdsl.lang import branches as lang_graph
from kdsl.lang import operator as lang_operator
from kdsl.lang.nonlinear import JOIN, JOINS, NONLINEAR, UNARY, Join
from kdsl.lang.primitives import PRIMITIVES, VIEW, Field, Primitive
from kdsl.lang.sizes import Size, coefficient, primary
from kdsl.search import kinds
from kdsl.solve.cost import GRAPH_FLOPS
from kdsl.testing import strategies


@pytest.mark.parametrize("kind", sorted(PRIMITIVES))
def test_every_primitive_is_declared_once_with_fields_facts_and_rank(kind):
    cls = PRIMITIVES[kind]
    assert issubclass(cls, Primitive) and cls.kind == kind
    assert cls.fields and all(isinstance(f, Field) for f in cls.fields)
    assert {f.kind for f in cls.fields} <= {"ref", "name", "size", "int", "bool", "weight"}
    assert cls.facts and isinstance(cls.rank, int)
    assert not cls.ports or len(cls.ports) >= 2  # ports name the dims of a step that makes several
    if VIEW in cls.facts:  # a view has a bottom-up coordinate rule of its own
        assert cls.coordinate is not Primitive.coordinate


def _one_step_operator(kind: str):
    """A small operator whose only view step is ``kind``, with its concrete layer."""
    from kdsl.lang import Dilate, Expand, Input, Merge, Output, Shift, Slide, Split, Stride, Unfold

    N, L = primary("N L")
    K, B = coefficient("K"), coefficient("B")
    layer = {"N": 2, "L": 6, "K": 3, "B": 2}
    if kind == "Split":
        return Input(N, L) >> Split(L, B, "o", "i") >> Output(N, "o", "i"), layer
    if kind == "Merge":
        return Input(N, L) >> Merge(N, L, "m") >> Output("m"), layer
    if kind == "Shift":
        return Input(N, L) >> Shift(L, 2) >> Shift(L, -1) >> Output(N, L), layer
    if kind == "Expand":
        return Input(N, L) >> Expand("e", K) >> Output(N, "e", L), layer
    if kind == "Unfold":
        return Input(N, L) >> Unfold(L, K, "k") >> Output(N, L, "k"), layer
    if kind == "Stride":
        return Input(N, L) >> Unfold(L, K, "k") >> Stride("L", B) >> Output(N, "L", "k"), layer
    if kind == "Slide":  # (L - K) // B + 1 windows: P = 2 at L = 6, K = 3, B = 2
        P = primary("P")
        return Input(N, L) >> Slide(L, K, P, "k", stride=B) >> Output(N, "L", "k"), layer | {"P": 2}
    if kind == "Dilate":
        return Input(N, L) >> Dilate(L, B) >> Output(N, "L"), layer
    raise AssertionError(f"no example for {kind}")


@pytest.mark.parametrize("bound", [False, True], ids=["symbolic", "at-binding"])
@pytest.mark.parametrize("sizes", [{}, {"K": 1, "B": 1}, {"N": 1, "L": 2, "B": 2}], ids=["plain", "K=B=1", "N=1"])
@pytest.mark.parametrize("kind", sorted(k for k, c in PRIMITIVES.items() if VIEW in c.facts))
def test_coordinate_rules_read_what_the_reference_computes(kind, sizes, bound):
    """Walking a view bottom-up with its declared rule reads, for every output element, the input
    element (or the zero of a failed guard) that the reference interpreter puts there: over symbolic
    sizes (the loop-nest listing) and over the sizes at the binding (TVM), size-1 dims included."""
    op, layer = _one_step_operator(kind)
    layer = layer | sizes
    if "P" in layer:  # a Slide's number of windows follows from its dim, window and stride
        layer["K"] = min(layer["K"], layer["L"])
        layer["P"] = (layer["L"] - layer["K"]) // layer["B"] + 1
    shape = reference.shapes(op, layer).input
    x = np.arange(1.0, 1.0 + np.prod(shape)).reshape(shape)
    expected = reference.run(op, layer, x, [])
    views = op.views()
    if bound:
        views = [
            (step.at(layer), {n: Size.of(int(s.evaluate(layer))) for n, s in live.items()}) for step, live in views
        ]
    names = [d.name for d in op.outputs]
    checked = 0
    for position in np.ndindex(*expected.shape):
        coords, guards = index.walk_up(views, {n: index.Var(n) for n in names})
        indices = dict(zip(names, position))
        inside = all(g.holds(indices, layer) for g in guards)
        source = tuple(index.evaluate(coords[d.name], indices, layer) for d in op.inputs)
        assert expected[position] == (x[source] if inside else 0.0)
        checked += 1
    assert checked == expected.size > 0


def _every_index_node() -> list[index.Index]:
    """One instance of every kind of index expression, over constant sizes (as backends lower them)."""
    from kdsl.lang.sizes import Size

    four, i = Size.of(4), index.Var("i")
    nodes = [
        i,
        index.Const(2),
        index.SizeOf(four),
        index.Half(four),
        index.Add(i, index.Const(1), -1),
        index.Scale(i, four),
        index.FloorDiv(i, four),
        index.Mod(i, four),
        index.Cyclic(i, 1, four),
    ]
    kinds = {type(n) for n in nodes}
    public = {c for c in vars(index).values() if isinstance(c, type) and issubclass(c, index.Index)}
    assert kinds == {c for c in public if not c.__name__.startswith("_")} - {index.Index}
    return nodes


def test_every_index_expression_has_a_tvm_form_and_a_value():
    """The TVM backend lowers every node of the coordinate algebra, to the value evaluate() gives."""
    from kdsl.codegen.tvm import load_tvm
    from kdsl.codegen.tvm.chain_stages import _tir

    tvm = load_tvm()

    def value(expr):  # constant TIR (TVM folds arithmetic on constants, not a Select)
        if isinstance(expr, tvm.tirx.Select):
            return value(expr.true_value) if value(expr.condition) else value(expr.false_value)
        return int(expr)

    checked = 0
    for node in _every_index_node():
        for at in range(4):
            lowered = _tir(tvm, node, {"i": tvm.tirx.const(at, "int32")})
            assert value(lowered) == index.evaluate(node, {"i": at}, {})
            checked += 1
    assert checked == 4 * len(_every_index_node())


# -- branching kernels: Canvas's primitives, the joins and the Chain node -------------------------

#: the kinds of graph node every backend lowers: the unary Canvas steps, the joins, and a chain
#: (the input node is the argument, not a step)
NODE_KINDS = sorted({*UNARY, *JOINS, lang_operator.CHAIN})
#: the field kinds the DSL printer, the JSON writer and reader and the content key handle
FIELD_KINDS = {"ref", "refs", "name", "size", "int", "bool", "choice", "number", "weight"}


def _tables() -> dict[str, tuple[dict, list[str], str]]:
    """Each backend's (or pass's) per-primitive table and each backend's per-node-kind table of
    branching kernels, by a readable name, with the kinds it covers and what they are called."""
    primitives = sorted(PRIMITIVES)
    return {
        "reference.RULES": (reference.RULES, primitives, "primitives"),
        "torch.RULES": (kdsl_torch.RULES, primitives, "primitives"),
        "search.kinds.SEARCH_RULES": (kinds.SEARCH_RULES, primitives, "primitives"),
        "testing.strategies.DRAWS": (strategies.DRAWS, primitives, "primitives"),
        "reference.GRAPH_RULES": (reference.GRAPH_RULES, NODE_KINDS, "node kinds"),
        "torch.GRAPH_RULES": (kdsl_torch.GRAPH_RULES, NODE_KINDS, "node kinds"),
        "tvm.GRAPH_RULES": (kdsl_tvm.GRAPH_RULES, NODE_KINDS, "node kinds"),
        "render.LOOP_NEST_RULES": (render.LOOP_NEST_RULES, NODE_KINDS, "node kinds"),
        # the cost model also counts the input node (0 FLOPs)
        "cost.GRAPH_FLOPS": ({k: v for k, v in GRAPH_FLOPS.items() if k != "Input"}, NODE_KINDS, "node kinds"),
    }


@pytest.mark.parametrize("table", sorted(_tables()))
def test_every_table_has_a_rule_for_every_kind(table):
    rules, kinds_covered, what = _tables()[table]
    missing = sorted(set(kinds_covered) - set(rules))
    extra = sorted(set(rules) - set(kinds_covered))
    assert not missing, f"{table} has no rule for {', '.join(missing)}"
    assert not extra, f"{table} has rules for unknown {what} {', '.join(extra)}"
    # a node kind's rule is a function (a primitive's may be a record, as search's KindRule)
    assert what == "primitives" or all(callable(rule) for rule in rules.values())


def test_node_kinds_are_declared_once():
    """No kind is both a linear primitive and a Canvas step or join: a chain holds only the
    linear primitives, and every pass tells the kinds apart by name."""
    assert not set(PRIMITIVES) & set(UNARY) and not set(PRIMITIVES) & set(JOINS) and not set(UNARY) & set(JOINS)
    assert not {lang_operator.CHAIN, lang_operator.INPUT} & (set(PRIMITIVES) | set(UNARY) | set(JOINS))
    assert lang_graph.JOIN_FUNCTIONS.keys() == JOINS.keys()


CANVAS_KINDS = {**UNARY, **JOINS}  # disjoint: test_node_kinds_are_declared_once


@pytest.mark.parametrize("kind", sorted(CANVAS_KINDS))
def test_every_canvas_step_and_join_is_declared_with_fields_and_facts(kind):
    """A Canvas step is a Primitive with a rank and is no join; a join is a non-linear Join."""
    cls = CANVAS_KINDS[kind]
    joins = kind in JOINS
    assert issubclass(cls, Join if joins else Primitive) and cls.kind == kind
    assert cls.fields and all(isinstance(f, Field) for f in cls.fields)
    assert {f.kind for f in cls.fields} <= FIELD_KINDS
    if joins:
        assert JOIN in cls.facts and NONLINEAR in cls.facts
    else:
        assert cls.facts and isinstance(cls.rank, int) and JOIN not in cls.facts
    _check_choices(cls)


def _check_choices(cls: type) -> None:
    """A choice field lists its choices, and an optional field's default is one of them."""
    for f in cls.fields:
        if f.kind == "choice":
            assert cls.choices.get(f.name), f"{cls.kind}.{f.name} is a choice without choices"
            assert not f.optional or f.default in cls.choices[f.name]
        if f.optional:
            assert f.default is not None, f"{cls.kind}.{f.name} is optional without a default"
    assert set(getattr(cls, "choices", {})) <= {f.name for f in cls.fields}


def _every_field_value() -> list[tuple[str, object]]:
    """For every Canvas step and join, kernels that set each of its fields to a non-default
    value (every choice of every choice field), with the kind they exercise."""
    N, C, H = primary("N C H")
    R = primary("R")
    x = Input(N, C, H)
    made: list[tuple[str, object]] = []
    for fn in UNARY["Map"].choices["fn"]:
        step = Map(fn, by=-0.25) if fn == "scale" else Map(fn)
        made.append(("Map", x >> step >> Output(N, C, H)))
    for how in UNARY["Fold"].choices["how"]:
        made.append(("Fold", x >> Unfold(H, 3, "k") >> Fold("k", how=how) >> Output(N, C, H)))
    made.append(("Softmax", x >> Softmax(C, H) >> Output(N, C, H)))
    made.append(("FC", x >> FC(C, H, name="o", size=R, weight="proj") >> Output(N, "o")))
    made.append(("Rename", x >> Rename(H, "P") >> Map("abs") >> Output(N, C, "P")))
    for how in JOINS["Blend"].choices["how"]:
        made.append(("Blend", Blend(how, x >> Map("tanh"), x >> Unfold(H, 3, "k") >> Fold("k")) >> Output(N, C, H)))
    made.append(("Product", Product(x, x >> Rename(H, "P"), "C", "N") >> Output(H, "P")))
    return made


def test_every_canvas_field_survives_text_json_and_the_key():
    """Every field kind a Canvas step or join declares is one the printer, the JSON form and the
    key handle: each kind's kernels, every choice set, read back equal from both, and kernels
    that differ only in one field's value have different keys."""
    made = _every_field_value()
    assert {kind for kind, _ in made} == set(UNARY) | set(JOINS)
    keys: dict[str, set[str]] = {}
    for kind, graph in made:
        assert kdsl.parse(graph.to_dsl()) == graph, graph.to_dsl()
        assert kdsl.from_json(graph.to_json()) == graph, graph.to_json()
        keys.setdefault(kind, set()).add(graph.key)
    counts = {kind: sum(k == kind for k, _ in made) for kind in keys}
    assert {kind: len(found) for kind, found in keys.items()} == counts

"""Every primitive is declared once in kdsl.lang and has one entry in every table that lowers,
renders, checks or searches it: adding a primitive fails here until each table has its rule."""

import numpy as np
import pytest

from kdsl.codegen import reference
from kdsl.lang import index
from kdsl.lang.primitives import PRIMITIVES, VIEW, Field, Primitive
from kdsl.lang.sizes import coefficient, primary


def _tables() -> dict[str, dict]:
    """Each backend's (or pass's) per-primitive table, by a readable name."""
    return {"reference.RULES": reference.RULES}


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


@pytest.mark.parametrize("table", sorted(_tables()))
def test_every_table_has_a_rule_for_every_primitive(table):
    rules = _tables()[table]
    missing = sorted(set(PRIMITIVES) - set(rules))
    extra = sorted(set(rules) - set(PRIMITIVES))
    assert not missing, f"{table} has no rule for {', '.join(missing)}"
    assert not extra, f"{table} has rules for unknown primitives {', '.join(extra)}"


def _one_step_operator(kind: str):
    """A small operator whose only view step is ``kind``, with its concrete layer."""
    from kdsl.lang import Expand, Input, Merge, Output, Shift, Split, Stride, Unfold

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
    raise AssertionError(f"no example for {kind}")


@pytest.mark.parametrize("kind", sorted(k for k, c in PRIMITIVES.items() if VIEW in c.facts))
def test_coordinate_rules_read_what_the_reference_computes(kind):
    """Walking a view bottom-up with its declared rule reads, for every output element, the input
    element (or the zero of a failed guard) that the reference interpreter puts there."""
    op, layer = _one_step_operator(kind)
    x = np.arange(1.0, 1.0 + np.prod(reference.shapes(op, layer).input)).reshape(reference.shapes(op, layer).input)
    expected = reference.run(op, layer, x, [])
    views = op.views()
    names = [d.name for d in op.outputs]
    checked = 0
    for position in np.ndindex(*expected.shape):
        coords, guards = index.walk_up(views, {n: index.Var(n) for n in names})
        indices = dict(zip(names, position))
        inside = all(0 <= index.evaluate(g.expr, indices, layer) < int(g.extent.evaluate(layer)) for g in guards)
        source = tuple(index.evaluate(coords[d.name], indices, layer) for d in op.inputs)
        assert expected[position] == (x[source] if inside else 0.0)
        checked += 1
    assert checked == expected.size > 0

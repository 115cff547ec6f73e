"""The strategy that searches around known designs (kdsl.search.neighbors)."""

from __future__ import annotations

from kdsl import gallery
from kdsl.lang.parser import parse
from kdsl.search.neighbors import Neighbors, rewrites, seeds
from kdsl.search.run import search
from kdsl.search.space import Space
from kdsl.search.store import Store

SPACE = dict(coefficients={"K": [3], "G": [2, 4], "s": [2]}, max_flops="0.5x")


def test_seeds_are_the_gallery_designs_that_fit_the_spec_at_each_allowed_coefficient():
    space = Space("conv2d", "resnet18", **SPACE)
    found = seeds(space)
    names = {name for name, _ in found}
    assert {"conv2d", "grouped_conv2d", "depthwise_separable_conv2d", "pointwise_conv2d"} <= names
    assert "strided_conv2d" not in names and "max_pool2d" not in names  # other shapes, or branching
    grouped = [op.default_coefficients["G"] for name, op in found if name == "grouped_conv2d"]
    assert sorted(grouped) == [2, 4]
    for _, op in found:
        assert [d.size for d in op.inputs] == [d.size for d in space.spec.inputs]


def test_rewrites_build_and_keep_the_spec():
    import random

    space = Space("conv2d", "resnet18", **SPACE)
    op = gallery.load("grouped_conv2d")
    found = list(rewrites(op, space, random.Random(0)))
    kinds = {text.split()[0].split("=")[0] for text, _ in found}
    assert {"G", "drop", "Shift(H)", "Shift(W)", "swap"} <= kinds
    for _, other in found:
        assert parse(other.to_dsl()) == other
        assert [d.size for d in other.outputs] == [d.size for d in op.outputs]


def test_search_stores_known_designs_first_with_their_origin_and_resumes(tmp_path):
    db = str(tmp_path / "n.sqlite")
    space = Space("conv2d", "resnet18", **SPACE)
    first = search(space, "neighbors", db=db, max_results=30)
    assert first.new == 30
    store = Store(db)
    try:
        rows = store.top(k=1000, status=None)
    finally:
        store.close()
    keys = {row["key"] for row in rows}
    assert gallery.load("grouped_conv2d").with_defaults(G=4).key in keys
    # a design at two coefficient values is two candidates, neither a duplicate of the other
    status = {row["key"]: row["status"] for row in rows}
    grouped = gallery.load("grouped_conv2d")
    assert status[grouped.with_defaults(G=2).key] == status[grouped.with_defaults(G=4).key] == "valid"
    origins = {row["metrics"]["origin"] for row in rows}
    assert "grouped_conv2d" in origins
    second = search(space, "neighbors", db=db, max_results=10)
    assert second.new == 10 and set(second.found).isdisjoint(first.found)  # resumed: nothing given twice
    assert Neighbors(space, progress={"emitted": 40}).progress() == {"emitted": 40}


def test_a_step_replayed_on_other_dims_resolves_again():
    from kdsl.lang.build import Builder
    from kdsl.lang.primitives import Output

    conv = gallery.load("conv2d")
    assert conv.steps[0].describe().startswith("Unfold(H")
    dropped = Builder(conv.inputs, conv.steps[1:], None, []).finish(Output(*(d.name for d in conv.outputs)))
    weight = dropped.weights[0]
    # without the window over H, the weight's kh is a dim of its own, which the Reduce then sums
    assert dict(zip((d.name for d in weight.dims), weight.new))["kh"] is True
    assert dropped.key != conv.key and parse(dropped.to_dsl()) == dropped


def test_transposes_interleave_groups_and_shifts_come_last():
    import random

    import numpy as np

    from kdsl.codegen import reference

    space = Space("conv2d", "resnet18", **SPACE)
    op = gallery.load("grouped_conv2d").with_defaults(G=2)
    found = list(rewrites(op, space, random.Random(0)))
    texts = [text for text, _ in found]
    shifted = [i for i, text in enumerate(texts) if text.startswith("Shift(")]
    assert shifted and min(shifted) > max(i for i, text in enumerate(texts) if not text.startswith("Shift("))
    # transposes first, drops after everything but the shifts
    assert texts[0].startswith("transpose") and texts[1].startswith("transpose")
    dropped = [i for i, text in enumerate(texts) if text.startswith("drop")]
    assert dropped and min(dropped) > max(i for i, text in enumerate(texts) if text.startswith(("G=", "swap")))
    merged = dict(found)["transpose Merge(g, co)"]
    split = dict(found)["transpose Split(Cin, Cin/G)"]
    # the transposed Merge interleaves the groups' output channels: out[2 co + g] = grouped[g * Cout/2 + co]
    layer = {"N": 1, "Cin": 4, "Cout": 4, "H": 3, "W": 3, "G": 2, "K": 3}
    rng = np.random.default_rng(0)
    x = rng.standard_normal(reference.shapes(op, layer).input)
    weights = [rng.standard_normal(s) for s in reference.shapes(op, layer).weights]
    base = reference.run(op, layer, x, weights)
    shuffled = reference.run(merged, layer, x, weights)
    assert np.allclose(shuffled[:, 0::2], base[:, :2]) and np.allclose(shuffled[:, 1::2], base[:, 2:])
    # the transposed Split makes group g read the channels c with c % G == g
    ones = np.zeros_like(x)
    ones[:, 1] = 1.0  # channel 1 only: group 1 of the interleaved split, group 0 of the blocks
    assert np.abs(reference.run(split, layer, ones, weights)[:, :2]).sum() == 0
    assert np.abs(reference.run(op, layer, ones, weights)[:, 2:]).sum() == 0


def test_grouping_a_weight_is_the_dense_operator_with_block_diagonal_weights():
    import numpy as np

    from kdsl.codegen import reference
    from kdsl.search.neighbors import grouped

    dense = gallery.load("conv2d")
    words, op = grouped(dense, 2, 2, fixed={"N", "H", "W"})
    assert words == "group Share(w) by G" and op.default_coefficients["G"] == 2
    assert op.design_key == gallery.load("grouped_conv2d").design_key
    layer = {"N": 2, "Cin": 4, "Cout": 6, "H": 5, "W": 5, "G": 2, "K": 3}
    rng = np.random.default_rng(1)
    x = rng.standard_normal(reference.shapes(dense, layer).input)
    (shape,) = reference.shapes(op, layer).weights
    w = rng.standard_normal(shape)  # [g, co, ci, kh, kw]
    full = np.zeros(reference.shapes(dense, layer).weights[0])  # [Cout, Cin, kh, kw]
    groups, outs, ins = shape[:3]
    for g in range(groups):
        full[g * outs : (g + 1) * outs, g * ins : (g + 1) * ins] = w[g]
    assert np.allclose(reference.run(op, layer, x, [w]), reference.run(dense, layer, x, [full]))
    # a step that shares no weight over a channel (a window only, or no Share) is not grouped
    assert grouped(dense, 0, 2, fixed={"N", "H", "W"}) is None
    assert grouped(gallery.load("depthwise_conv2d"), 2, 2, fixed={"N", "H", "W"}) is None


def test_the_walk_takes_cheap_rewrites_first_and_reaches_a_shuffled_grouped_two_stage_conv():
    from kdsl.search.neighbors import COST, rewrite_kind

    space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [2, 4, 8], "s": [2]}, max_flops="0.5x")
    walk = Neighbors(space, seed=3)
    costs, reached = [], None
    for index, found in zip(range(400), walk.states()):
        rewrites_done = found.metrics["rewrites"]
        costs.append(sum(COST[rewrite_kind(text)] for text in rewrites_done))
        kinds = [rewrite_kind(text) for text in rewrites_done]
        if found.metrics["origin"] == "conv2d_kx1_1xk" and kinds.count("group") == 2 and "transpose" in kinds:
            reached = reached if reached is not None else index
    assert costs == sorted(costs)  # cheapest first: every design with a drop or shift after these
    # both stages grouped, the first stage's output channels interleaved: ShuffleNet's mixing
    assert reached is not None and reached < 200


def test_a_grouped_weight_is_not_grouped_again():
    from kdsl.search.neighbors import grouped

    fixed = {"N", "H", "W"}
    _, once = grouped(gallery.load("conv2d"), 2, 2, fixed)
    share = next(i for i, step in enumerate(once.steps) if type(step).__name__ == "Share")
    assert grouped(once, share, 2, fixed) is None  # G*G groups: grouped_conv2d at another G
    known = gallery.load("grouped_conv2d")
    share = next(i for i, step in enumerate(known.steps) if type(step).__name__ == "Share")
    assert grouped(known, share, 2, fixed) is None

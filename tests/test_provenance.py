"""Families modulo spatial rolls and flips, and the provenance line of a candidate."""

import numpy as np
import pytest
from graph_kernels import interleaved_grouped

from kdsl import gallery
from kdsl.codegen import reference
from kdsl.lang import Input, Output, Reduce, Share, Shift, Split, Unfold, Weight, coefficient, primary
from kdsl.search.neighbors import rebuilt
from kdsl.search.provenance import KNOWN, NEW, UNCOMPARED, VARIANT, describe, structure, without_shifts
from kdsl.search.semantic import canonical_pattern, fingerprint, output_transforms

N, Cin, H, W, Cout = primary("N Cin H W Cout")
G, K = coefficient("G K")


def grouped(*extra_steps_at: tuple[int, object], weight_dims=("g", "co", "ci", "kh", "kw")):
    """The gallery's grouped conv, with ``(position, step)`` inserted."""
    from kdsl.lang import Dim, Merge

    w = Weight("g", Dim("co", Cout / G), "ci", "kh", "kw", name="w")
    steps = [
        Split(Cin, Cin / G, "g", "ci"),
        Unfold(H, K, "kh"),
        Unfold(W, K, "kw"),
        Share(w),
        Reduce("ci", "kh", "kw"),
        Merge("g", "co", "Cout"),
    ]
    for position, step in sorted(extra_steps_at, key=lambda p: -p[0]):
        steps.insert(position, step)
    pipeline = Input(N, Cin, H, W)
    for step in steps:
        pipeline = pipeline >> step
    return pipeline >> Output(N, Cout, H, W, defaults={"G": 2, "K": 3})


def rolled_output_matches(op, base, roll_w: int) -> None:
    """``op`` computes ``torch.roll(base(x), roll_w, dims=W)`` on the reference backend."""
    layer = {"N": 1, "Cin": 4, "Cout": 4, "H": 5, "W": 6, "G": 2, "K": 3}
    rng = np.random.default_rng(0)
    shapes = reference.shapes(base, layer)
    x = rng.standard_normal(shapes.input)
    weights = [rng.standard_normal(s) for s in shapes.weights]
    expected = np.roll(reference.run(base, layer, x, weights), roll_w, axis=3)
    assert np.allclose(reference.run(op, layer, x, weights), expected)


def test_roll_of_the_output_folds():
    # a Shift of W applied after the reduction rolls the output: the same design
    base = grouped()
    rolled = grouped((6, Shift(W)))
    rolled_output_matches(rolled, base, -1)
    assert fingerprint(rolled) == fingerprint(base)
    assert fingerprint(gallery.load("grouped_conv2d_shifted_window")) == fingerprint(gallery.load("grouped_conv2d"))
    assert fingerprint(gallery.load("shift_conv2d")) == fingerprint(gallery.load("pointwise_conv2d"))


def test_reparametrization_folds_and_a_real_change_does_not():
    # a re-parametrization: Split by G vs by Cin/G with the weight over both parts is still grouped
    # conv's family only when the groups stay; a Shift of H before its window is a real change
    # (the zero padding moves relative to the roll), so is a dropped window
    base = fingerprint(grouped())
    assert fingerprint(grouped((1, Shift(H)))) != base
    assert fingerprint(gallery.load("conv2d")) != base
    assert fingerprint(gallery.load("depthwise_conv2d")) != base


def test_canonical_pattern_is_invariant_under_every_roll_and_flip():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 5, size=(2 * 3 * 4, 3))
    axes = [("Cout", 2), ("H", 3), ("W", 4)]
    first = canonical_pattern(labels, axes)
    for roll, flip in output_transforms(axes):
        grid = labels.reshape(2, 3, 4, 3)
        for axis, r, f in zip((1, 2), roll, flip):
            grid = np.roll(np.flip(grid, axis) if f else grid, r, axis)
        assert np.array_equal(canonical_pattern(grid.reshape(labels.shape), axes), first)
    assert len(output_transforms(axes)) == 3 * 4 * 4


def test_provenance_names_the_gallery_design():
    found = describe(gallery.load("grouped_conv2d").with_defaults(G=2))
    assert (found.kind, found.design) == (KNOWN, "grouped_conv2d")
    assert found.line == "is `grouped_conv2d` (G=2, K=3)"
    rolled = describe(grouped((6, Shift(W))), names=["grouped_conv2d", "conv2d"])
    assert rolled.kind == KNOWN
    assert rolled.line == "`grouped_conv2d` (G=2, K=3) with its output rolled by -1 along W"
    assert rolled.family == found.family


def test_provenance_of_a_gallery_design_with_shifts_inserted():
    op = grouped((1, Shift(H)), (4, Shift(W)))
    assert without_shifts(op) == grouped()
    found = describe(op, names=["grouped_conv2d", "conv2d", "pointwise_conv2d"])
    assert found.kind == VARIANT and found.design == "grouped_conv2d"
    assert found.line == "`grouped_conv2d` (G=2, K=3) with Shift(H, 1) at step 2, Shift(W, 1) at step 6"
    assert found.base == describe(grouped()).family and found.family != found.base


def grouped_one_by_three():
    """A grouped conv with a 1x3 window (no window over H): no gallery operator."""
    from kdsl.lang import Dim, Merge

    w = Weight("g", Dim("co", Cout / G), "ci", "kw", name="w")
    return (
        Input(N, Cin, H, W)
        >> Split(Cin, Cin / G, "g", "ci")
        >> Unfold(W, K, "kw")
        >> Share(w)
        >> Reduce("ci", "kw")
        >> Merge("g", "co", "Cout")
        >> Output(N, Cout, H, W, defaults={"G": 2, "K": 3})
    )


def test_provenance_of_a_new_design():
    op = grouped_one_by_three()
    found = describe(op)
    assert found.kind == NEW and found.design is None
    assert found.line.startswith(
        "new (G=2, K=3): 1 weight w[g, co, ci, kw]; windows over W; Cin split; channels merged"
    )
    # two edits: the window over H and its reduction
    assert "nearest gallery design by steps: `grouped_conv2d` (2 edits)" in found.line
    told = describe(op, origin={"origin": "grouped_conv2d", "rewrites": ["drop Unfold(H, K)"]})
    assert told.line.endswith("from `grouped_conv2d` by drop Unfold(H, K)")


def test_provenance_of_a_branching_kernel_compares_keys():
    graph = gallery.load("squeeze_excitation")
    assert describe(graph).kind == KNOWN
    assert describe(graph, names=["conv2d"]).kind == UNCOMPARED


def test_structure_names_weights_and_windows():
    text = structure(gallery.load("syno_op1"))
    assert text.startswith("2 weights") and "windows over" in text


@pytest.mark.parametrize("name", ["conv2d", "pointwise_conv2d", "depthwise_separable_conv2d", "syno_op1"])
def test_every_gallery_operator_is_itself(name):
    found = describe(gallery.load(name))
    assert found.kind == KNOWN and found.line.startswith("is `")


def test_a_gallery_design_with_its_shifts_moved_or_removed_is_a_variant():
    syno_op2 = gallery.load("syno_op2").with_defaults(G=2)
    moved = list(syno_op2.steps)
    moved[1], moved[2] = moved[2], moved[1]  # Shift(H) after the window over H instead of before it
    from kdsl.lang.build import Builder

    output = Output("N", "Cout", "H", "W", defaults=dict(syno_op2.defaults))
    swapped = Builder(syno_op2.inputs, tuple(moved), None, []).finish(output)
    names = ["syno_op2", "syno_op1", "conv2d"]
    found = describe(swapped, names=names)
    assert found.kind == VARIANT and found.design == "syno_op2"
    assert found.line == "`syno_op2` (G=2, K=3, s=2) with its Shift steps changed: Shift(H, 1) at step 3"
    removed = describe(without_shifts(syno_op2), names=names)
    assert removed.kind == VARIANT and removed.line.endswith("with its Shift steps removed")


def test_channels_relabelled_alike_on_input_and_output_are_the_design():
    names = ["grouped_conv2d", "conv2d"]
    both = describe(interleaved_grouped(True, True), names=names)
    assert both.kind == KNOWN and both.design == "grouped_conv2d"
    assert (
        both.line == "`grouped_conv2d` (G=2, K=3) with its channels relabelled (interleaved by 2 on input and output)"
    )
    assert both.family == describe(gallery.load("grouped_conv2d"), names=names).family
    # a shuffle on one side only mixes the groups of consecutive layers: a new design
    for split, merge in ((True, False), (False, True)):
        assert describe(interleaved_grouped(split, merge), names=names).kind == NEW


def test_shifts_inserted_into_a_relabelled_gallery_design_make_a_variant():
    # found by discover (seed 4): both interleavings and a Shift of H, which is grouped conv relabelled
    # with a shift inserted, not a new design
    relabelled = interleaved_grouped(True, True)
    shifted = rebuilt(relabelled, (Shift("H"), *relabelled.steps))
    assert shifted is not None
    found = describe(shifted, names=["grouped_conv2d", "conv2d"])
    assert found.kind == VARIANT and found.design == "grouped_conv2d"
    assert "channels relabelled" in found.line and "Shift(H, 1) at step 1" in found.line

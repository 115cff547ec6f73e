"""Semantic fingerprints: re-parametrizations of one function family collide, different families
do not; search stores one operator per family."""

import pytest

from kdsl import gallery
from kdsl.bench.rediscover import NO_VIEWS
from kdsl.bench.search_throughput import equal_channel_families
from kdsl.lang import Dim, Input, Output, Reduce, Share, Shift, Split, Unfold, Weight, coefficient, primary
from kdsl.search.run import search
from kdsl.search.semantic import EQUAL_CHANNEL_LAYERS, EQUAL_CHANNEL_RANK_LAYERS, duplicates, fingerprint
from kdsl.search.space import Space
from kdsl.search.store import Store

N, Cin, H, W, Cout = primary("N Cin H W Cout")
G, K = coefficient("G K")


def pointwise_split(block):
    """A pointwise conv whose input channels are split first (by ``block``), the weight over both parts."""
    w = Weight(Cout, "g", "c", name="w")
    return (
        Input(N, Cin, H, W)
        >> Split(Cin, block, "g", "c")
        >> Share(w)
        >> Reduce("g", "c")
        >> Output(N, Cout, H, W, defaults={"G": 4})
    )


def pointwise_shifted():
    w = Weight(Cout, Cin, name="w")
    return Input(N, Cin, H, W) >> Shift(Cin) >> Share(w) >> Reduce(Cin) >> Output(N, Cout, H, W)


def pointwise_windowed():
    """A window over the channels whose offsets a weight owns, then reduced: still a pointwise conv
    (each input channel gets the sum of the weights that reach it)."""
    w = Weight(Cout, Cin, "k", name="w")
    return (
        Input(N, Cin, H, W)
        >> Unfold(Cin, K, "k")
        >> Share(w)
        >> Reduce(Cin, "k")
        >> Output(N, Cout, H, W, defaults={"K": 3})
    )


def rank_one():
    """out[o] = a[o] * sum_c b[c] x[c]: all entries distinct like a pointwise conv, but rank one."""
    b = Weight(Cin, name="b")
    a = Weight(Cout, name="a")
    return Input(N, Cin, H, W) >> Share(b) >> Reduce(Cin) >> Share(a) >> Output(N, Cout, H, W)


def test_reparametrizations_collide():
    pointwise = fingerprint(gallery.load("pointwise_conv2d"))
    assert pointwise is not None
    assert fingerprint(pointwise_split(Cin / G)) == pointwise
    assert fingerprint(pointwise_split(G)) == pointwise
    assert fingerprint(pointwise_shifted()) == pointwise
    assert fingerprint(pointwise_windowed()) == pointwise


@pytest.mark.parametrize("name", ["conv2d", "depthwise_separable_conv2d", "grouped_conv2d", "dilated_conv2d"])
def test_different_families_differ(name):
    pointwise = fingerprint(gallery.load("pointwise_conv2d"))
    found = fingerprint(gallery.load(name))
    assert found is not None and found != pointwise
    assert found == fingerprint(gallery.load(name))  # deterministic


def test_rank_tells_products_from_full_weights():
    # same equality pattern (every entry a different polynomial), different dimension
    assert fingerprint(rank_one()) != fingerprint(gallery.load("pointwise_conv2d"))
    # depthwise then pointwise has conv2d's pattern but not its dimension
    assert fingerprint(gallery.load("depthwise_separable_conv2d")) != fingerprint(gallery.load("conv2d"))


def test_the_channel_pair_probe_tells_interleaved_groups_where_pattern_and_rank_cannot():
    from kdsl.search.neighbors import rebuilt
    from kdsl.search.semantic import Families, pair_rank, pattern_key, rank_of

    syno = gallery.load("syno_op2").with_defaults(G=2)
    steps = list(syno.steps)
    at = next(i for i, step in enumerate(steps) if isinstance(step, Split))
    steps[at] = Split(steps[at].dim, G, "ci", "g")  # group g takes every G-th input channel
    interleaved = rebuilt(syno, tuple(steps))
    # every output reads every input either way: one pattern, one dimension ...
    assert pattern_key(interleaved) == pattern_key(syno) and rank_of(interleaved) == rank_of(syno)
    # ... but two channels of one group span less than two of different groups
    assert pair_rank(syno) < pair_rank(interleaved)
    families = Families(None)
    assert families.classify("blocks", syno)[2] is None
    assert families.classify("interleaved", interleaved)[2] is None  # a family of its own
    # a re-parametrization keeps every such dimension: still one family
    assert families.classify("again", syno.with_defaults(G=2))[2] == "blocks"
    reparametrized = Families(None)
    reparametrized.classify("a", gallery.load("pointwise_conv2d"))
    assert reparametrized.classify("b", pointwise_shifted())[2] == "a"


def test_equal_channel_layers_join_families_that_differ_only_where_cout_is_not_cin():
    # a pointwise conv whose weight is [Cin, Cin] (a Cin -> Cin operator) re-parametrizes the
    # [Cout, Cin] one where Cout = Cin, and only there
    square = square_pointwise()
    pointwise = gallery.load("pointwise_conv2d")
    assert fingerprint(square) != fingerprint(pointwise)
    equal = {"layers": EQUAL_CHANNEL_LAYERS, "rank_layers": EQUAL_CHANNEL_RANK_LAYERS}
    assert fingerprint(square, **equal) == fingerprint(pointwise, **equal) is not None
    texts = [square.to_dsl(), pointwise.to_dsl(), gallery.load("conv2d").to_dsl()]
    assert duplicates(texts) == (3, 3) and duplicates(texts, **equal) == (3, 2)


def square_pointwise():
    """A pointwise conv from Cin to Cin channels (its weight is [Cin, Cin])."""
    w = Weight(Dim("o", Cin), Cin, name="w")
    return Input(N, Cin, H, W) >> Share(w) >> Reduce(Cin) >> Output(N, "o", H, W)


def test_the_bench_counts_cin_to_cin_results_that_reparametrize_a_spec_result():
    texts = [square_pointwise().to_dsl(), gallery.load("pointwise_conv2d").to_dsl(), gallery.load("conv2d").to_dsl()]
    assert equal_channel_families(Space("conv2d", "resnet18"), texts) == (2, 1)
    assert equal_channel_families(Space("conv2d", "resnet18"), texts[1:]) == (2, 0)


def test_no_fingerprint_without_a_batch_dim_or_for_graphs():
    assert fingerprint(gallery.load("pointwise_conv2d"), batch=()) is None
    assert fingerprint(gallery.load("squeeze_excitation")) is None


def test_search_stores_one_operator_per_family_across_resumes(tmp_path):
    space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=6, reductions=["Cin", "K"], caps=NO_VIEWS)
    db = str(tmp_path / "r.db")
    first = search(space, "enumerate", db=db, max_results=10, commit_every=0.0)
    rest = search(space, "enumerate", db=db)
    assert rest.finished and first.duplicates + rest.duplicates > 0
    store = Store(db)
    valid = store.top(10**6)
    duplicate = store.top(10**6, status="duplicate")
    keys = {r["key"] for r in valid}
    assert duplicate and all(r["metrics"]["duplicate_of"] in keys for r in duplicate)
    assert len(valid) == first.new + rest.new
    operators, families = duplicates([r["dsl"] for r in valid])
    assert operators == len(valid) and operators - families <= 0.05 * operators
    # without dedupe the same space stores every re-parametrization
    plain = search(space, "enumerate", dedupe=False)
    assert plain.new == len(valid) + len(duplicate)

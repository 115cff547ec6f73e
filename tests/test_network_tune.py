"""``kdsl tune --network``: the shared budget's allocation (a fake measurer), the compiled ResNet-18
against the PyTorch network of the same weights in every layout, channel-blocked kernels, and the
command's errors."""

from __future__ import annotations

import random

import pytest
from backends import backend

from kdsl import gallery
from kdsl.cli import main
from kdsl.lang.errors import KdslError, LoweringError
from kdsl.tune import network as tune_network_module
from kdsl.tune.network import BudgetScheduler, NetworkTask, TaskSummary, tune_network
from kdsl.tune.records import Record, TuneResult

backend("tvm")

import torch  # noqa: E402  (after the skip: the compiled network needs TVM)

from kdsl.bench.network_head import head_binding, head_op, kernel_key  # noqa: E402
from kdsl.bench.network_strided import max_pool_op, strided_op  # noqa: E402
from kdsl.bench.network_tune import LAYOUTS, compile_network, network_tasks  # noqa: E402
from kdsl.codegen.tvm import build, lower  # noqa: E402
from kdsl.codegen.tvm.epilogue import Epilogue, FusedKernel, build_fused  # noqa: E402
from kdsl.codegen.tvm.prepack import prepack_weights  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.codegen.tvm.signature_layout import build_blocked, from_blocked, to_blocked  # noqa: E402
from kdsl.discover.network import resnet18, resolve_ops  # noqa: E402
from kdsl.tune.measurer import signature_schedule  # noqa: E402
from kdsl.tune.records import open_task  # noqa: E402

RESOLUTION = 32
#: kernels compiled once for the layouts that share them (blocked and propagated)
KERNELS: dict = {}


# ------------------------------------------------------------------------------------------------
# The budget, with a fake measurer


class FakeTasks:
    """Tasks whose latency after ``t`` trials follows a given curve; records every round it is asked."""

    def __init__(self, curves: list[list[float]]) -> None:
        self.curves = curves
        self.trials = [0] * len(curves)
        self.rounds: list[int] = []

    def run_round(self, index: int, count: int) -> tuple[int, float]:
        curve = self.curves[index]
        self.rounds.append(index)
        self.trials[index] += count
        return count, curve[min(self.trials[index] // 8, len(curve) - 1)]


def allocated(weights: list[int], curves: list[list[float]], total: int) -> FakeTasks:
    scheduler = BudgetScheduler(weights, round_trials=8)
    fake = FakeTasks(curves)
    for index, curve in enumerate(curves):
        scheduler.record_default(index, curve[0])
    given = scheduler.allocate(total, fake.run_round)
    assert given == sum(fake.trials) <= total
    return fake


def test_the_budget_goes_where_the_expected_saving_is_largest():
    # both tasks improve at the same relative pace; the first runs 4 times a pass at twice the latency
    curves = [[2.0 * 0.9**k for k in range(20)], [1.0 * 0.9**k for k in range(20)]]
    fake = allocated([4, 1], curves, 80)
    assert fake.rounds[0] == 0 and fake.trials[0] > fake.trials[1]
    assert sum(fake.trials) == 80


def test_a_task_that_stops_improving_yields_the_budget_to_one_that_still_improves():
    flat = [1.0] * 60  # no round ever improves it
    improving = [1.0 * 0.9**k for k in range(60)]
    fake = allocated([1, 1], [flat, improving], 320)
    assert fake.trials[1] > 2 * fake.trials[0]
    # yet the stalled task is not abandoned for good: it is tried again, less and less often
    half = len(fake.rounds) // 2
    assert 0 < fake.rounds[half:].count(0) < fake.rounds[:half].count(0)


def test_equal_tasks_share_the_budget_evenly():
    curve = [1.0 * 0.95**k for k in range(40)]
    fake = allocated([3, 3, 3], [curve, curve, curve], 72)
    assert fake.trials == [24, 24, 24]


def test_a_task_whose_tuner_is_exhausted_is_dropped_and_a_failed_default_still_gets_tuned():
    scheduler = BudgetScheduler([1, 1], round_trials=4)
    scheduler.record_default(0, None)  # its default schedule failed: it counts as the slowest task
    scheduler.record_default(1, 0.001)
    asked = []

    def run_round(index: int, count: int) -> tuple[int, float | None]:
        asked.append(index)
        return (0, None) if index == 0 else (count, 0.001)

    given = scheduler.allocate(12, run_round)
    assert asked[0] == 0 and asked.count(0) == 1 and given == 12
    scheduler.tasks[1].done = True
    assert scheduler.next_task() is None


def test_bad_scheduler_arguments_are_refused_with_what_was_given():
    with pytest.raises(KdslError, match="positive weight"):
        BudgetScheduler([])
    with pytest.raises(KdslError, match="round_trials"):
        BudgetScheduler([1], round_trials=0)
    with pytest.raises(KdslError, match="occurrence count"):
        NetworkTask("t", gallery.load("conv2d"), {}, 0)
    with pytest.raises(KdslError, match="scale must be positive"):
        NetworkTask("t", gallery.load("conv2d"), {}, 1, 0.0)


def test_tune_network_measures_every_default_before_any_round(monkeypatch, tmp_path):
    events = []

    class FakeMeasurer:
        def __init__(self, op, binding, block=0, prepacked=False):
            events.append(("open", binding["H"]))

        def close(self):
            events.append(("close", None))

    def fake_default(task, db, measurer):
        events.append(("default", task.label))
        return 0.001 * task.weight

    def fake_tune(op, layer, tuner, trials, db, **kwargs):
        events.append(("round", layer["H"]))
        assert kwargs["confirm"] == 0 and trials <= 8
        return TuneResult("k", tuner, None, [], trials, 0, 0.0)

    def fake_summary(task, db, trials=0):
        return TaskSummary(task.label, task.weight, trials, 1.0, 0.5)

    monkeypatch.setattr(tune_network_module, "Measurer", FakeMeasurer)
    monkeypatch.setattr(tune_network_module, "measure_default", fake_default)
    monkeypatch.setattr(tune_network_module, "tune", fake_tune)
    monkeypatch.setattr(tune_network_module, "task_summary", fake_summary)
    item = resolve_ops(["conv2d"], resolution=RESOLUTION)[0]
    tasks = network_tasks(item, [1], RESOLUTION, replace="3x3")
    summaries = tune_network(tasks, 24, str(tmp_path / "t.db"))
    kinds = [kind for kind, _ in events]
    assert kinds.count("default") == 4 and kinds.index("round") > max(i for i, k in enumerate(kinds) if k == "default")
    assert sum(s.trials for s in summaries) == 24 and kinds.count("round") == 3
    assert kinds.count("open") == kinds.count("close")  # every measurer closed


# ------------------------------------------------------------------------------------------------
# The compiled network


@pytest.fixture(scope="module")
def network():
    """ResNet-18 with conv2d at 32x32, batch 1, and batch norms with random statistics (so folding
    them into a scale and shift is checked, not the identity)."""
    item = resolve_ops(["conv2d"], resolution=RESOLUTION)[0]
    net = resnet18(item, batch=1, resolution=RESOLUTION, classes=10, seed=1)
    generator = torch.Generator().manual_seed(2)
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            count = module.num_features
            module.running_mean.copy_(torch.rand(count, generator=generator) - 0.5)
            module.running_var.copy_(torch.rand(count, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(count, generator=generator) + 0.5)
            module.bias.data.copy_(torch.rand(count, generator=generator) - 0.5)
    return item, net, torch.randn(1, 3, RESOLUTION, RESOLUTION, generator=generator)


def assert_same_output(compiled, net, x, transforms: int | None = None) -> None:
    with torch.no_grad():
        compiled.trace = []
        got, expected = compiled(x), net(x)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), float((got - expected).abs().max())
    if transforms is not None:
        assert len(compiled.trace) == transforms


@pytest.fixture(scope="module")
def tuned_db(network, tmp_path_factory):
    """A records database whose best conv2_x records, one for the plain signature and one for the
    channel-blocked one (tuned apart: another task), are two different random valid schedules of the
    space (not the default one), so each layout is checked on a schedule the tuners could pick. Returns
    the database and the configuration of each signature (channel block -> configuration)."""
    item = network[0]
    db = str(tmp_path_factory.mktemp("net") / "records.db")
    task = network_tasks(item, [1], RESOLUTION, replace="3x3")[0]
    rng = random.Random(0)
    configs = {}
    for block in (0, 16):
        binding, key, store = open_task(task.op, task.layer, db, block)
        space = ScheduleSpace(lower(task.op, binding))
        for _ in range(50):
            config = space.random(rng)
            try:
                signature_schedule(space, config, 16)  # blockable, even the plain one (plain_records=True)
                configs[block] = config
                break
            except LoweringError:
                continue
        store.add(key, Record(config, 1e-9, None, "opevo"))
        store.database.close()
    assert configs[0] != configs[16]
    return db, configs


def conv2_x_script(block: int, config: dict, borrowed: bool = False) -> None:
    """The conv2_x kernel compiled for a network (in KERNELS) and the schedule of ``config`` it should run,
    as TVM script: the record's, then its packed weights taken by the signature (prepacked)."""
    shape = (1, 64, 8, 8) if block == 0 else (1, 64 // 16, 8, 8, 16)
    (kernel,) = [
        k
        for (op_key, _, b, p, epilogue, prepack, _), k in KERNELS.items()
        if (b, p, epilogue, prepack) == (block, borrowed, None, True)
        and k.input_shape == shape
        and op_key != strided_op().key
    ]
    expected, layouts = prepack_weights(
        signature_schedule(ScheduleSpace(kernel.lowered), config, block), kernel.lowered
    )
    assert kernel.schedule.mod.script() == expected.mod.script()
    assert kernel.weight_layouts == layouts


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_compiled_network_computes_what_the_pytorch_network_computes(network, tuned_db, layout, fuse):
    _, net, x = network
    db, configs = tuned_db
    compiled = compile_network(net, layout, db=db, block=16, kernels=KERNELS, fuse=fuse)
    # 13 kdsl layers: 2 transforms a layer unpropagated (fused, a block's second kernel also takes the
    # residual: 8 more); propagated, 1 into stage 2, 3 in each later stage
    transforms = {"plain": 0, "blocked": 34 if fuse else 26, "propagated": 10}[layout]
    assert_same_output(compiled, net, x, transforms)
    kernels = compiled_kernels(compiled)
    # plain: every convolution (the stem, 3 stride-2 ones and their 3 shortcuts besides the 13); the
    # blocked layouts keep PyTorch's for those 7
    assert len(kernels) == (20 if layout == "plain" else 13)
    assert isinstance(compiled.pool, tuple) == (layout == "plain")  # the stem's max pooling
    # the head (average pooling and classifier): one kdsl kernel in the plain layout, its bias in the
    # epilogue when fused; PyTorch's in the blocked layouts
    assert (compiled.head is not None) == (layout == "plain")
    if compiled.head is not None:
        assert isinstance(compiled.head[0], FusedKernel) == fuse
    # fused: every kdsl kernel carries its epilogue, folded into its write-back (no pass of its own)
    assert (
        all(isinstance(k, FusedKernel) and k.folded for k in kernels)
        if fuse
        else not any(isinstance(k, FusedKernel) for k in kernels)
    )
    if not fuse:  # conv2_x runs the record tuned in the signature it runs in (blocked: blocked after the schedule)
        block = 0 if layout == "plain" else 16
        conv2_x_script(block, configs[block])
    # the weights every kernel's schedule packs are packed once, when compiled (all 13 kernels at these
    # sizes pack theirs), or by the kernels on every call
    assert all(k.prepacked for k in kernels)
    weights = [w for conv in compiled_convolutions(compiled) if isinstance(conv, tuple) for w in conv[1]]
    if compiled.head is not None and compiled.head[0].prepacked:  # the classifier's, where its schedule packs it
        weights += compiled.head[1]
    assert compiled.prepacked_bytes == sum(w.numel() * 4 for w in weights) > 0
    per_call = compile_network(net, layout, db=db, block=16, kernels=KERNELS, fuse=fuse, prepack=False)
    assert_same_output(per_call, net, x, transforms)
    assert per_call.prepacked_bytes == 0


def compiled_convolutions(compiled) -> list:
    """Every convolution of a compiled network: a kdsl one is a (kernel, weights) pair, a PyTorch one its module."""
    convolutions = [compiled.stem_conv] + [block[i] for block in compiled.blocks for i in (0, 2)]
    convolutions += [block[4][0] for block in compiled.blocks if block[4] is not None]
    assert len(convolutions) == 20
    return convolutions


def compiled_kernels(compiled) -> list:
    """The kdsl kernels of a compiled network (a convolution that is a (kernel, weights) pair), at least one."""
    kernels = [conv[0] for conv in compiled_convolutions(compiled) if isinstance(conv, tuple)]
    assert kernels
    return kernels


def test_the_old_form_keeps_pytorchs_strided_convolutions_and_the_strided_kernels_run_their_records(network, tmp_path):
    _, net, x = network
    compiled = compile_network(net, "plain", kernels=KERNELS, replace="3x3")
    assert_same_output(compiled, net, x, 0)
    assert len(compiled_kernels(compiled)) == 13 and not isinstance(compiled.stem_conv, tuple)
    assert compiled.head is None and not isinstance(compiled.pool, tuple)
    # a record of the stem's task is the schedule its kernel runs, with the epilogue folded after it
    stem = next(task for task in network_tasks(network[0], [1], RESOLUTION, replace="all") if "stem" in task.label)
    binding, key, store = open_task(stem.op, stem.layer, str(tmp_path / "stem.db"), 0)
    space = ScheduleSpace(lower(stem.op, binding))
    config = space.random(random.Random(3))
    store.add(key, Record(config, 1e-9, None, "opevo"))
    store.database.close()
    stages = {key: kernel for key, kernel in KERNELS.items() if key[0] != strided_op().key}  # compiled before
    compiled = compile_network(net, "plain", db=str(tmp_path / "stem.db"), kernels=stages)
    assert_same_output(compiled, net, x, 0)
    kernel = compiled.stem_conv[0]
    assert isinstance(kernel, FusedKernel) and kernel.folded and kernel.input_shape == (1, 3, RESOLUTION, RESOLUTION)
    # unfused, the stem's kernel is the record's schedule itself, not the default one
    default = compile_network(net, "plain", kernels=stages, fuse=False).stem_conv[0]
    unfused = compile_network(net, "plain", db=str(tmp_path / "stem.db"), kernels=stages, fuse=False)
    assert_same_output(unfused, net, x, 0)
    assert_runs_record(unfused.stem_conv[0], config, default)
    with pytest.raises(KdslError, match="unknown replace 'some'"):
        compile_network(net, "plain", replace="some")


def test_the_network_tasks_have_the_strided_convolutions_once_a_pass():
    item = resolve_ops(["conv2d"], resolution=RESOLUTION)[0]
    tasks = network_tasks(item, [1, 8], RESOLUTION, replace="all")
    strided = [task for task in tasks if task.op == strided_op()]
    assert len(tasks) == 26 and len(strided) == 14 and {task.weight for task in strided} == {1}
    assert [(t.layer["Cin"], t.layer["Cout"], t.layer["H"], t.layer["K"], t.layer["s"]) for t in strided[:3]] == [
        (3, 64, RESOLUTION, 7, 2),
        (64, 128, RESOLUTION // 4, 3, 2),
        (64, 128, RESOLUTION // 4, 1, 2),
    ]
    assert len(network_tasks(item, [1], RESOLUTION, block=16, replace="all")) == 4  # blocked: the 3x3 ones only
    with pytest.raises(KdslError, match="unknown --replace '1x1'"):
        network_tasks(item, [1], RESOLUTION, replace="1x1")


def test_the_max_pooling_and_the_head_are_tasks_once_a_pass_at_every_batch_size():
    item = resolve_ops(["conv2d"], resolution=RESOLUTION)[0]
    resolution = 2 * RESOLUTION  # a final feature map of 2 x 2: the mean has something to average
    tasks = network_tasks(item, [1, 2], resolution, classes=7)
    ours = [task for task in tasks if task.op in (max_pool_op(), head_op())]
    assert [(task.label, task.weight, task.scale) for task in ours] == [
        ("maxpool 3x3/2 N=1", 1, 1.0),
        ("avgpool+fc N=1", 1, 1.0),
        ("maxpool 3x3/2 N=2", 1, 0.5),
        ("avgpool+fc N=2", 1, 0.5),
    ]
    pool, head = ours[2].layer, ours[3].layer
    # the pooling reads the stem's output (64 channels, half the input); the head the last stage's
    assert (pool["N"], pool["Cin"], pool["H"], pool["K"], pool["s"]) == (2, 64, resolution // 2, 3, 2)
    assert (head["N"], head["Cin"], head["Cout"], head["H"], head["W"]) == (
        2,
        512,
        7,
        resolution // 32,
        resolution // 32,
    )
    assert not any(task.op == head_op() for task in network_tasks(item, [1], RESOLUTION, replace="3x3"))
    with pytest.raises(KdslError, match="number of classes must be a positive integer, got 0"):
        network_tasks(item, [1], RESOLUTION, classes=0)


def test_the_head_kernel_computes_the_mean_and_the_classifier_with_its_bias():
    binding = head_binding(2, 2 * RESOLUTION, 5)
    kernel = build_fused(head_op(), binding, Epilogue(relu=False))
    x, weight, bias = torch.randn(2, 512, 2, 2), torch.randn(5, 512), torch.randn(5)
    with torch.no_grad():
        got = kernel(x, *kernel.pack_weights([weight]), scale=torch.ones(5), shift=bias)
    expected = torch.nn.functional.linear(x.mean(dim=(2, 3)), weight, bias)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), float((got - expected).abs().max())


def assert_runs_record(kernel, config, default) -> None:
    """``kernel`` (compiled with its weights prepacked) runs the schedule of ``config``, which is not the
    schedule of ``default`` (the same layer's default-schedule kernel)."""
    expected, _ = prepack_weights(ScheduleSpace(kernel.lowered).apply(config), kernel.lowered)
    assert kernel.schedule.mod.script() == expected.mod.script() != default.schedule.mod.script()


def test_the_max_pooling_and_the_head_run_their_records_and_a_shared_cache_keeps_dbs_apart(network, tmp_path):
    item, net, x = network
    db = str(tmp_path / "head.db")
    cache: dict = {}
    default = compile_network(net, "plain", kernels=cache, fuse=False)
    defaults = {max_pool_op().key: default.pool[0], head_op().key: default.head[0]}
    configs = {}
    for task in network_tasks(item, [1], RESOLUTION, classes=10)[-2:]:
        binding, key, store = open_task(task.op, task.layer, db, 0)
        space, rng = ScheduleSpace(lower(task.op, binding)), random.Random(5)
        # a random schedule that is not the default one, so running the default would fail the check
        script = defaults[task.op.key].schedule.mod.script()
        for _ in range(20):
            config = space.random(rng)
            if prepack_weights(space.apply(config), space.lowered)[0].mod.script() != script:
                break
        configs[task.op.key] = config
        store.add(key, Record(config, 1e-9, None, "opevo"))
        store.database.close()
    tuned = compile_network(net, "plain", db=db, kernels=cache, fuse=False)
    assert_same_output(tuned, net, x, 0)
    for op, kernel in ((max_pool_op(), tuned.pool[0]), (head_op(), tuned.head[0])):
        assert kernel is not defaults[op.key]
        assert_runs_record(kernel, configs[op.key], defaults[op.key])
    # fused: the same record with the bias in the epilogue, folded into the write-back or a pass of its own
    fused = compile_network(net, "plain", db=db, kernels=cache)
    assert_same_output(fused, net, x, 0)
    assert isinstance(fused.head[0], FusedKernel) and fused.pool[0] is tuned.pool[0]
    keys = {kernel_key(head_op(), head_binding(1, RESOLUTION, 10), name, None, True) for name in (db, None)}
    assert {key for key, kernel in cache.items() if kernel in (tuned.head[0], default.head[0])} == keys


def test_a_blocked_network_can_run_the_plain_records_for_comparison(network, tuned_db):
    _, net, x = network
    db, configs = tuned_db
    compiled = compile_network(net, "propagated", db=db, block=16, kernels=KERNELS, plain_records=True, fuse=False)
    assert_same_output(compiled, net, x, 10)
    conv2_x_script(16, configs[0], borrowed=True)


def test_a_kernel_cache_shared_with_default_schedules_gives_the_tuned_network_its_records(network, tuned_db):
    _, net, x = network
    db, configs = tuned_db
    cache: dict = {}
    default = compile_network(net, "plain", kernels=cache, fuse=False)
    tuned = compile_network(net, "plain", db=db, kernels=cache, fuse=False)
    # each network's first kdsl kernel: conv2_x's
    first = [next(b[0][0] for b in compiled.blocks if isinstance(b[0], tuple)) for compiled in (default, tuned)]
    assert first[0] is not first[1]
    expected, _ = prepack_weights(signature_schedule(ScheduleSpace(first[1].lowered), configs[0]), first[1].lowered)
    assert first[1].schedule.mod.script() == expected.mod.script()
    assert_same_output(tuned, net, x)


def test_compile_network_refuses_the_original_network_and_unknown_layouts(network):
    _, net, _ = network
    with pytest.raises(KdslError, match="unknown layout 'nhwc'"):
        compile_network(net, "nhwc")
    with pytest.raises(KdslError, match="built with an operator"):
        compile_network(resnet18(batch=1, resolution=RESOLUTION, classes=10), "plain")


def test_a_blocked_kernel_computes_the_plain_one_and_refuses_what_it_cannot_do():
    op = gallery.load("grouped_conv2d")
    layer = {"N": 2, "Cin": 16, "Cout": 16, "H": 5, "W": 5, "G": 2}
    kernel = build_blocked(op, layer, 8)
    x = torch.randn(2, 16, 5, 5)
    weights = [torch.randn(*shape) for shape in kernel.weight_shapes]
    with torch.no_grad():
        expected = build(op, layer)(x, *weights)
        got = from_blocked(kernel(to_blocked(x, 8), *weights))
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(KdslError, match="size 16.* cannot be blocked by 3"):
        build_blocked(op, layer, 3)
    with pytest.raises(LoweringError, match="no_grad"):
        kernel(to_blocked(x, 8), weights[0].requires_grad_())


# ------------------------------------------------------------------------------------------------
# The command


def test_the_command_refuses_unknown_networks_unfit_operators_and_mixed_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--network", "resnet50"])
    assert "invalid choice: 'resnet50'" in capsys.readouterr().err
    assert main(["tune", "matmul", "--network", "resnet18", "--resolution", "32"]) == 2
    assert "matmul cannot replace ResNet-18's 3x3 convolutions at conv2_x" in capsys.readouterr().err
    assert main(["tune", "conv2d", "--network", "resnet18", "--layers", "conv3_x"]) == 2
    assert "give no --layers" in capsys.readouterr().err
    assert main(["tune", "conv2d", "--layers", "conv3_x", "--batch", "8"]) == 2
    assert "--compile-batch" in capsys.readouterr().err
    assert main(["tune"]) == 2
    assert "needs an OPERATOR" in capsys.readouterr().err
    assert main(["tune", "--network", "resnet18", "--block", "24", "--resolution", "32"]) == 2
    assert "--block: conv2_x's channels (dim 1, size 64) cannot be blocked by 24" in capsys.readouterr().err


def test_a_network_at_two_batch_sizes_shares_the_budget_per_image():
    tasks = network_tasks(resolve_ops(["conv2d"], resolution=32)[0], [1, 8], 32, replace="3x3")
    assert [task.scale for task in tasks] == [1.0] * 4 + [1 / 8] * 4
    # batch 8 takes 7x batch 1's time (better per image): without the scale it would win every round
    scheduler = BudgetScheduler([task.weight * task.scale for task in (tasks[0], tasks[4])])
    scheduler.record_default(0, 0.001)
    scheduler.record_default(1, 0.007)
    assert [tasks[0].layer["N"], tasks[4].layer["N"]] == [1, 8] and tasks[0].weight == tasks[4].weight
    assert scheduler.next_task() == 0

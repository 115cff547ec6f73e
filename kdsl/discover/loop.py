"""The main job: search, evaluate and rank replacements for a network's convolutions.

``kdsl discover`` alternates two phases until its time is up, on one SQLite database:

1. *search*: one strategy (gallery neighbours, MCTS, Canvas's sampler, ...) over the space proposes
   new canonical operators that are valid on every layer (the proxy network's layers, where
   accuracy is measured, and the latency table's) and within the FLOPs budget; the search's own
   store keeps them, the strategy that found each, and each strategy's progress;
2. *evaluate*: the most promising candidates of that strategy not evaluated yet go to an executor (worker
   processes with a hard per-candidate timeout, one latency measurement at a time), which trains
   the proxy network with the candidate in every convolution and times it against the baseline;
   each result (or failure) is stored in the ``evaluations`` table, and the candidate's reward in
   the search store becomes the measured one (Syno §7.2: accuracy first, then speed), so the
   MCTS tree that the next search phase rebuilds follows measured rewards. Before that, each
   candidate is classified (:mod:`kdsl.discover.families`): what it is (a gallery design, one
   with its output rolled, one with shifts inserted, or new) is stored, and one that repeats the
   design and coefficients of a candidate already screened or trained is not trained again.

The strategies of ``--strategy`` take turns (a round each: search, screen, train), each round
resuming that strategy's own progress, so that a strategy that is never exhausted (sampling,
MCTS) does not starve the others: each takes one round in order, then the one whose trained
candidates were usable most often takes the next, while every one keeps at least half of an
equal share of the rounds (:class:`kdsl.discover.turns.Turns`); an exhausted strategy only
has its remaining candidates evaluated. :func:`kdsl.discover.turns.per_strategy` counts what
each strategy produced.

Re-running the same command resumes: finished evaluations are neither lost nor repeated. At the
end it writes the ranked table, the Pareto plot and the candidates' pages (:mod:`.report`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kdsl import gallery
from kdsl.discover.baseline_cache import baseline_key_parts, cache_directory, load_baseline, store_baseline
from kdsl.discover.evaluation_store import Evaluations
from kdsl.discover.evaluators import check_device
from kdsl.discover.executors import Task, make_executor
from kdsl.discover.families import FamilyTable, training_key
from kdsl.discover.network import NetworkOp, network_latency
from kdsl.discover.proxy import ProxyConfig, proxy_layers
from kdsl.discover.ranking import family_counts, merged_strategy_counts, records_from, top_families
from kdsl.discover.report import write_report
from kdsl.discover.turns import Turns, count_per_strategy, strategy_lines, usable
from kdsl.lang.errors import KdslError, SearchError, printable
from kdsl.lang.parser import parse
from kdsl.search.analytic import budget_reward, reward
from kdsl.search.neighbors import takes_capacity
from kdsl.search.run import STRATEGIES, search
from kdsl.search.space import SPECS, Space, load_spec
from kdsl.search.store import Store
from kdsl.solve.layers import load_layers

#: ``--net`` -> the proxy backbone (:data:`kdsl.discover.proxy.BACKBONES`)
NETS = {"proxy-resnet": "resnet", "proxy-vgg": "vgg"}


@dataclass
class DiscoverConfig:
    """What one ``kdsl discover`` run does; equal configs resume each other."""

    net: str = "proxy-resnet"
    spec: str = "conv2d"
    max_flops: str | None = "0.5x"
    #: fewest parameters, relative to conv2d: operators with almost no weights cannot learn, so
    #: they are not trained (0.002x keeps a depthwise 3x3 conv, 0.0028x, and drops operators
    #: whose weights are a per-channel vector, ~0.0004x, or a single small window)
    min_params: str | None = "0.002x"
    #: fewest MACs relative to conv2d: an operator with under ~0.1x conv2d's MACs rarely trains to
    #: within a point of it on the proxy, and from-nothing strategies (MCTS's analytic reward
    #: favours few MACs) otherwise fill the training queue with them; below it is not trained
    min_flops: str | None = "0.1x"
    max_depth: int = 6
    #: search strategies taking turns (one search, screen and train round each): gallery neighbours
    #: find known designs and their rewrites quickly, so they keep one turn in three; MCTS (its
    #: reward the measured accuracy) and Canvas's sampler (kernels filled to the FLOPs budget)
    #: start from nothing, which is where new families come from, and get the other two
    strategy: str = "neighbors,mcts,canvas"
    time_limit: float = 300.0
    db: str = "runs.sqlite"
    out: str = "out"
    executor: str = "local"
    workers: int = 1
    seed: int = 0
    batch: int = 4
    eval_timeout: float = 240.0
    margin: float = 0.02
    latency_layers: Any = "resnet18"
    epochs: int = ProxyConfig.epochs
    top: int = 5
    #: after the time limit, time ResNet-18 end to end with this many of the top families
    #: (kdsl.discover.network; a few minutes) and add it to the report; 0: not at all
    network_top: int = 0
    #: the proxy's data (:mod:`kdsl.discover.data`): digits, cifar10:DIR, cifar100:DIR, npz:FILE, folder:DIR
    data: str = "digits"
    #: the pre-screening score (:mod:`kdsl.discover.prescreen`) that picks which candidates to
    #: train, or None to train candidates in the search's order. grad_norm: Spearman 0.66 with
    #: the full proxy over 18 gallery and weak operators at ~1% of a training run's time (a
    #: 1-epoch run: 0.79 at ~10%; NASWOT 0.47, SynFlow 0.22); see kdsl bench prescreen
    prescreen: str | None = "grad_norm"
    #: candidates screened for each one trained
    screen_factor: int = 4
    #: other ProxyConfig fields (e.g. ``{"widths": [8, 16]}`` for a smaller proxy network)
    proxy: dict[str, Any] = field(default_factory=dict)
    #: the search's coefficient values; ``None`` (JSON null) for a coefficient derives its values from
    #: the layers (every value above 1 that divides a layer size on all of them, see
    #: :class:`~kdsl.search.space.Space`), and a coefficient of the spec's own sizes left out is derived
    coefficients: dict[str, list[int] | None] = field(default_factory=lambda: {"K": [3], "G": [2, 4, 8], "s": [2]})
    #: what ``latency_ratio`` (the ranking) divides: ``tvm``, the TVM kernel kdsl would deploy over
    #: conv2d's TVM kernel (eager PyTorch and PyTorch's conv2d are timed beside it), or ``torch``,
    #: kdsl's eager PyTorch module over PyTorch's conv2d
    latency_backend: str = "tvm"
    #: where candidates are timed: ``cpu``, or ``cuda`` (PyTorch on the GPU; needs latency_backend torch)
    device: str = "cpu"
    #: tuned schedules for the TVM kernels: ``{"db": records database, "lookup": "module:function"}``
    #: (``kdsl discover --tuned DB`` sets :func:`kdsl.tune.tuned.tuned_schedule`), or None for the
    #: default schedule
    tuned: dict[str, str] | None = None
    #: folder of the per-user baseline cache (None: ``$KDSL_CACHE_DIR`` or ``~/.cache/kdsl``);
    #: ``use_cache=False`` measures the baseline again
    cache_dir: str | None = None
    use_cache: bool = True

    def evaluators(self) -> list[Any]:
        if self.latency_backend not in ("tvm", "torch"):
            raise SearchError(f"unknown latency backend {printable(self.latency_backend)!r}: use tvm or torch")
        if self.device == "cuda" and self.latency_backend == "tvm":
            raise SearchError(
                "--device cuda times candidates with PyTorch on the GPU (kdsl's TVM kernels are CPU kernels "
                "for now): use --latency-backend torch with it"
            )
        backends = ["torch", "tvm"] if self.latency_backend == "tvm" else ["torch"]
        latency: dict[str, Any] = {"name": "latency", "layers": self.latency_layers, "batch": 1}
        latency.update(backends=backends, rank=self.latency_backend, device=self.device)
        if self.tuned is not None:
            latency["tuned"] = dict(self.tuned)
        return [
            {"name": "analytic", "layers": self.latency_layers},
            latency,
            {"name": "accuracy", **self._training()},
        ]

    def _training(self) -> dict[str, Any]:
        """The proxy training's settings: the run's seed seeds the weights and the data order too
        (``proxy`` may set its own)."""
        return {"epochs": self.epochs, "data": self.data, "backbone": self.backbone, "seed": self.seed, **self.proxy}

    def screener(self) -> dict[str, Any]:
        """The evaluator spec that scores a candidate before it is trained."""
        return {
            "class": "kdsl.discover.prescreen:PrescreenEvaluator",
            "method": self.prescreen,
            **self._training(),
        }

    @property
    def backbone(self) -> str:
        """The proxy backbone that ``net`` names (checked when the run starts)."""
        return NETS.get(self.net, "resnet")

    def proxy_config(self) -> Any:
        fields = {**self._training(), "epochs": self.epochs}
        if "widths" in fields:
            fields["widths"] = tuple(fields["widths"])
        return ProxyConfig(**fields)


def discovery_space(config: DiscoverConfig) -> Space:
    """The search space of a discovery: its spec on the proxy network's layers and the latency
    table's, with its coefficients, depth and budgets."""
    return _space(config)


def _space(config: DiscoverConfig) -> Any:
    if config.net not in NETS:
        raise SearchError(f"unknown network {printable(config.net)!r}; kdsl knows {', '.join(NETS)}")
    _check_spec(config.spec, config.backbone)
    layers = list(proxy_layers(config.proxy_config())) + list(load_layers(config.latency_layers))
    return Space(
        config.spec,
        layers,
        coefficients=config.coefficients,
        max_depth=config.max_depth,
        max_flops=config.max_flops,
        min_params=config.min_params,
        min_flops=config.min_flops,
    )


#: What the proxy network's convolutions map (its stages keep the width, so Cout may be Cin).
_PROXY_INPUT = ("N", "Cin", "H", "W")
_PROXY_OUTPUTS = (("N", "Cout", "H", "W"), ("N", "Cin", "H", "W"))


def _check_spec(spec: Any, backbone: str = "resnet") -> None:
    """Refuse, before any work, a spec whose operators cannot stand in the proxy network's
    convolutions: every candidate would fail to build there and the run would find nothing."""
    loaded = load_spec(spec)
    inputs = tuple(str(d.size) for d in loaded.inputs)
    outputs = tuple(str(d.size) for d in loaded.outputs)
    # the VGG proxy's first convolution of a stage widens the channels: Cout must be free there
    allowed = _PROXY_OUTPUTS if backbone == "resnet" else _PROXY_OUTPUTS[:1]
    if inputs == _PROXY_INPUT and outputs in allowed:
        return
    fitting = [
        name
        for name, known in SPECS.items()
        if tuple(str(d.size) for d in known.inputs) == _PROXY_INPUT
        and tuple(str(d.size) for d in known.outputs) in allowed
    ]
    same = " (Cin = Cout)" if backbone == "resnet" else " (Cin != Cout where a stage widens)"
    raise SearchError(
        f"the spec {printable(loaded.name)!r} maps [{', '.join(inputs)}] -> [{', '.join(outputs)}], but the proxy "
        f"network's convolutions map [N, Cin, H, W] -> [N, Cout, H, W]{same}; use --spec "
        f"{' or '.join(fitting)}, or a JSON spec of that shape"
    )


def _say(stream: TextIO | None, text: str) -> None:
    if stream is not None:
        stream.write(text + "\n")
        stream.flush()


def _pending(store: Store, done: set[str], limit: int, strategy: str | None = None) -> list[dict[str, Any]]:
    """The best valid candidates of the search store that are not in ``done`` (evaluated or
    screened); only those ``strategy`` found, when given."""
    rows = store.top(k=limit + len(done), status="valid", strategy=strategy)
    return [row for row in rows if row["key"] not in done][:limit]


#: the provenance kinds of gallery designs and their variants (:mod:`kdsl.search.provenance`)
KNOWN_KINDS = ("known", "variant")


def _fresh(
    store: Store,
    evaluations: Evaluations,
    families: FamilyTable,
    exclude: set[str],
    limit: int,
    strategy: str | None = None,
) -> list[dict[str, Any]]:
    """Up to ``limit`` of the best stored candidates not in ``exclude`` (of those ``strategy``
    found, when given), one per design: each is
    classified (:mod:`kdsl.discover.families`) and one whose base family and coefficients repeat
    those of a candidate screened or trained before is recorded as a repeat (a screen without a
    score) instead of returned."""
    exclude = set(exclude)
    taken = families.training_keys(exclude)
    picked: list[dict[str, Any]] = []
    while len(picked) < limit:
        rows = _pending(store, exclude, limit - len(picked), strategy)
        if not rows:
            break
        for row in rows:
            exclude.add(row["key"])
            design = training_key(families.classify(row))
            if design in taken:
                families.mark_repeat(row["key"], taken[design])
                evaluations.add_screen(row["key"], None, {"status": "repeat", "repeat_of": taken[design]})
            else:
                taken[design] = row["key"]
                picked.append(row)
    return picked


def _screen(
    config: DiscoverConfig,
    executor: Any,
    store: Store,
    evaluations: Evaluations,
    families: FamilyTable,
    progress: TextIO | None,
    strategy: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Screen up to ``batch * screen_factor`` new candidates (one per design, :func:`_fresh`; of
    those ``strategy`` found, when given), then pick the ``batch`` best-scored of the screened
    candidates not trained yet (again of ``strategy``'s), new designs before known ones and
    gallery neighbours that dropped a window or weight (:func:`~kdsl.search.neighbors.takes_capacity`)
    after the other new designs. Returns
    ``(to_train, failed)``: rows of the search store to train, and results of candidates whose
    screening failed (they would fail to train)."""
    done = evaluations.done()
    every = evaluations.screened()
    fresh = _fresh(store, evaluations, families, done | set(every), config.batch * config.screen_factor, strategy)
    # with the repeats _fresh recorded; of the candidates ``strategy`` stored, when given
    screened = evaluations.screened(among=store.found_by(strategy) if strategy else None)
    failed = []
    tasks = [Task.of(parse(row["dsl"]), [config.screener()], _widths(row)) for row in fresh]
    for task, result in executor.map(tasks):
        score = result["metrics"].get("prescreen") if result["status"] == "ok" else None
        evaluations.add_screen(task.key, score, result["metrics"] | {"status": result["status"]})
        screened[task.key] = score
        if score is None:
            failed.append(result)
    pool = sorted(
        ((score, key) for key, score in screened.items() if key not in done and score is not None), reverse=True
    )
    # new designs first, best-scored first; known designs and their variants when none is waiting:
    # they are reference points, while the time of a discovery is for what is not known yet. Among
    # new designs, gallery neighbours without one of their windows or weights come last: the
    # screen's score does not see what they lost (they scored among the best and trained worst)
    kinds = {key: row["kind"] for key, row in families.get(key for _, key in pool).items()}
    rows = store.get_many(key for _, key in pool)
    pool.sort(key=lambda item: (kinds.get(item[1]) in KNOWN_KINDS, _cut(rows[item[1]])))
    if fresh:
        whose = f" of {strategy}" if strategy else ""
        _say(
            progress,
            f"screened {len(fresh)} new candidates{whose} ({config.prescreen}); {len(pool)} screened, untrained",
        )
    return [rows[key] for _, key in pool[: config.batch]], failed


def _cut(row: Mapping[str, Any]) -> bool:
    """Whether a stored candidate is a gallery neighbour with a window or weight dropped."""
    return takes_capacity((row.get("metrics") or {}).get("rewrites"))


def _widths(row: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluation context of a stored candidate: a template's per-layer widths, if any."""
    widths = (row.get("metrics") or {}).get("widths")
    return {"widths": widths} if widths else {}


def measured_reward(
    metrics: Mapping[str, Any], status: str, baseline: Mapping[str, Any], margin: float = 0.02
) -> float:
    """The reward MCTS gets for a trained candidate: :func:`kdsl.search.analytic.reward`, and
    below the accuracy margin (where that is 0) a small credit that grows with accuracy.

    With a proxy that discriminates, nearly every early candidate falls below the margin; a flat
    0 tells MCTS only where not to go. The credit, ``0.25 (a / b)^2 / (1 + r)``, is at most half
    of what a candidate at the margin earns at the same speed, so accurate candidates still rank
    first at equal speed.

    >>> base = {"accuracy": 0.95}
    >>> low, lower = (measured_reward({"accuracy": a, "latency_ratio": 0.5}, "ok", base) for a in (0.6, 0.3))
    >>> 0 < lower < low < measured_reward({"accuracy": 0.94, "latency_ratio": 0.5}, "ok", base)
    True
    >>> measured_reward({"accuracy": 0.9}, "error", base)
    0.0
    """
    value = reward({**metrics, "status": status}, baseline, margin=margin)
    accuracy, base = metrics.get("accuracy"), baseline.get("accuracy")
    if value == 0.0 and status == "ok" and isinstance(accuracy, (int, float)) and base:
        ratio = metrics.get("latency_ratio", metrics.get("flops_ratio", 1.0))
        if isinstance(ratio, (int, float)) and ratio >= 0 and math.isfinite(ratio):
            value = 0.25 * min(1.0, accuracy / base) ** 2 / (1.0 + ratio)
    return value


def strategy_sequence(text: str) -> list[str]:
    """The strategies of ``--strategy`` (``"neighbors,mcts"``: they take turns, one round each).

    >>> strategy_sequence("neighbors, mcts")
    ['neighbors', 'mcts']
    >>> strategy_sequence("greedy")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.SearchError: unknown strategy 'greedy' in --strategy: choose from canvas, enumerate, ...
    """
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    for name in names:
        if name not in STRATEGIES:
            raise SearchError(
                f"unknown strategy {printable(name)!r} in --strategy: choose from {', '.join(sorted(STRATEGIES))}"
            )
    if not names:
        raise SearchError("--strategy names no strategy")
    return names


def discover(config: DiscoverConfig, progress: TextIO | None = sys.stderr) -> dict[str, Any]:
    """Run (or resume) a discovery; return a summary with the paths of what it wrote."""
    start = time.monotonic()
    space = _space(config)
    config.evaluators()  # a latency backend or device that cannot work fails here, before any work
    check_device(config.device)
    Path(config.db).parent.mkdir(parents=True, exist_ok=True)
    # one discovery per (space, strategy, seed) at a time: a second one would evaluate the same
    # candidates again; it is refused with a message naming this process (see kdsl.search.store)
    # the run's one store: the guard's lease, every search turn, the rewards, the report's reads
    store = Store(config.db)
    try:
        lease = store.claim(space.fingerprint(), f"discover:{config.strategy}", config.seed, space.describe())
    except BaseException:
        store.close()
        raise
    evaluations = Evaluations(config.db)
    families = FamilyTable(config.db)
    executor = make_executor(config.executor, workers=config.workers, timeout=config.eval_timeout)
    evaluators = config.evaluators()
    baseline_op = gallery.load("conv2d")
    try:
        if baseline_op.key not in evaluations.done():
            _baseline(config, executor, evaluations, baseline_op, evaluators, progress)
        baseline_metrics = evaluations.rows("baseline")[0]["metrics"]
        run = _Run(config, space, store, evaluations, families, executor, evaluators, baseline_metrics, progress, start)
        run.take_turns()
        return _write(config, store, evaluations, families, baseline_metrics, progress, write_report)
    finally:
        executor_close = getattr(executor, "close", None)
        if executor_close is not None:
            executor_close()
        evaluations.close()
        families.close()
        try:
            store.release(lease)
        finally:
            store.close()


@dataclass
class _Run:
    """One discovery's turns: the strategies take turns searching, screening and training until the
    time limit (the stores, the executor and the baseline are the run's, opened by :func:`discover`)."""

    config: DiscoverConfig
    space: Space
    store: Store
    evaluations: Evaluations
    families: FamilyTable
    executor: Any
    evaluators: list[Any]
    baseline_metrics: dict[str, Any]
    progress: TextIO | None
    start: float
    trained: int = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def take_turns(self) -> None:
        config = self.config
        exhausted: set[str] = set()
        # the strategies take turns, each resuming its own progress from the store: one that is
        # never exhausted (sampling, MCTS) must not starve the others, and the one whose trained
        # candidates are usable most often gets the most turns (kdsl.discover.turns.Turns)
        counts = count_per_strategy(self.store, self.evaluations, margin=config.margin)
        turns = Turns(strategy_sequence(config.strategy), counts=counts)
        while self.elapsed() < config.time_limit:
            name = turns.next()
            if name is None:
                _say(self.progress, "the search space is exhausted and every candidate is evaluated")
                break
            if name not in exhausted and self.search_turn(name, config.time_limit - self.elapsed()):
                exhausted.add(name)  # its remaining candidates are still evaluated in its turns
            batch = self.next_batch(name)
            if self.trained and self.elapsed() > config.time_limit:
                break  # screening took the rest of the time: no more training past the limit
            if not batch:
                seen = self.evaluations.done() | set(self.evaluations.screened())
                if name in exhausted and not _pending(self.store, seen, 1, name):
                    turns.skip(name)  # nothing left to search or evaluate: no more turns
                continue
            self.train(name, batch, turns)

    def search_turn(self, name: str, remaining: float) -> bool:
        """One search turn of strategy ``name`` into the run's store; True when it finished its space."""
        config = self.config
        report = search(
            self.space,
            name,
            store=self.store,
            seed=config.seed,
            time_limit=max(1.0, min(30.0, remaining / 4)),
            max_results=config.batch * max(4, 2 * config.screen_factor if config.prescreen else 0),
            # untrained candidates: use of the FLOPs budget, below what accurate trained
            # ones earn (measured_reward), so MCTS follows measured accuracy (Syno §7.2)
            # and otherwise leans to operators with the capacity to learn
            evaluator=budget_reward,
        )
        _say(
            self.progress, f"search ({name}): {report.new} new candidates ({report.valid} valid), {report.nodes} nodes"
        )
        return report.finished

    def next_batch(self, name: str) -> list[dict[str, Any]]:
        """The candidates strategy ``name`` trains next: the best screened (with a prescreen), else the
        best fresh ones."""
        config, evaluations = self.config, self.evaluations
        done = evaluations.done()
        if not config.prescreen:
            return _fresh(
                self.store, evaluations, self.families, done | set(evaluations.screened()), config.batch, name
            )
        batch, failed = _screen(config, self.executor, self.store, evaluations, self.families, self.progress, name)
        for result in failed:  # a candidate that cannot be scored cannot be trained either
            evaluations.add(result)
            self.store.set_reward(result["key"], 0.0)
        return batch

    def train(self, name: str, batch: list[dict[str, Any]], turns: Turns) -> None:
        """Train and time ``batch``; store each result and its reward, and credit strategy ``name``."""
        config = self.config
        # a template from Canvas's sampler carries its widths, filled per layer of the space
        tasks = [Task.of(parse(row["dsl"]), self.evaluators, _widths(row)) for row in batch]
        for task, result in self.executor.map(tasks):
            self.evaluations.add(result)
            metrics = result["metrics"]
            self.store.set_reward(
                task.key, measured_reward(metrics, result["status"], self.baseline_metrics, config.margin)
            )
            self.trained += 1
            ok = result["status"] == "ok"
            turns.record(name, ok and usable(metrics, self.baseline_metrics.get("accuracy"), config.margin))
            _say(self.progress, self.evaluated_line(task.key, result))
            if self.elapsed() > config.time_limit:
                break

    def evaluated_line(self, key: str, result: dict[str, Any]) -> str:
        """The progress line of one trained candidate."""
        accuracy = result["metrics"].get("accuracy")
        ratio = result["metrics"].get("latency_ratio")
        left = max(0.0, self.config.time_limit - self.elapsed())
        what = self.families.get([key]).get(key, {}).get("line")
        return (
            f"evaluated {key}: {result['status']}"
            + (f", accuracy {accuracy:.3f}" if accuracy is not None else "")
            + (f", latency x{ratio:.2f}" if ratio is not None else "")
            + (f" ({result['error'][:120]})" if result.get("error") else "")
            + (f"; {what}" if what else "")
            + f" [trained {self.trained}, screened {len(self.evaluations.screened())}, {left:.0f} s left]"
        )


def _baseline(
    config: DiscoverConfig,
    executor: Any,
    evaluations: Evaluations,
    baseline_op: Any,
    evaluators: list[Any],
    progress: TextIO | None,
) -> None:
    """Store the baseline's evaluation: from the per-user cache when this machine measured it with
    the same settings before (:mod:`.baseline_cache`), else measured now (and cached)."""
    parts = baseline_key_parts(evaluators, proxy=config.proxy_config(), seed=config.seed, workers=config.workers)
    directory = cache_directory(config.cache_dir)
    cached = load_baseline(directory, parts) if config.use_cache else None
    if cached is not None:
        where = cached["metrics"]["baseline_cache"]
        _say(progress, f"using the cached baseline (conv2d) measured {where['measured']} ({where['file']})")
        evaluations.add(cached, role="baseline")
        return
    _say(progress, "measuring the baseline (conv2d): proxy accuracy and latency")
    for _, result in executor.map([Task.of(baseline_op, evaluators)]):
        if result["status"] != "ok":
            raise SearchError(f"the baseline failed to evaluate: {result['error']}")
        evaluations.add(result, role="baseline")
        if config.use_cache:
            try:
                store_baseline(directory, parts, result)
            except OSError as error:  # a read-only home costs the next run the measurement, nothing else
                _say(progress, f"could not cache the baseline in {directory}: {error}")


def _network(config: DiscoverConfig, records: list[dict[str, Any]], accuracy: float, progress) -> list | None:
    """ResNet-18 end to end with the run's top families (``network_top`` of them, after the time
    limit), or None; a failure is said and leaves the rest of the report as it is."""
    chosen = top_families(records, baseline_accuracy=accuracy, margin=config.margin, count=config.network_top)
    if not chosen:
        return None
    _say(progress, f"timing ResNet-18 end to end with the top {len(chosen)} families (kdsl bench network)")
    ops = [NetworkOp(f"{record['key']} ({record.get('kind')})", parse(record["dsl"])) for record in chosen]
    try:
        return network_latency(ops, batches=(1, 8), progress=lambda line: _say(progress, f"network: {line}"))
    except KdslError as error:
        _say(progress, f"the end-to-end timing failed: {printable(error.message[:300])}")
        return None


def _write(
    config: DiscoverConfig,
    store: Store,
    evaluations: Evaluations,
    families: FamilyTable,
    baseline_metrics: dict,
    progress,
    write_report,
) -> dict:
    # the same records `kdsl results --db` ranks: one reader of the evaluations for both
    loaded = records_from(store, evaluations, families)
    if loaded is None:  # no evaluation stored yet besides what this process holds
        loaded = [], {"name": "conv2d", **{k: baseline_metrics.get(k) for k in ("accuracy", "params", "latency_ms")}}
    records, baseline = loaded
    accuracy = baseline["accuracy"] or 0.0
    stored = count_per_strategy(store, evaluations, margin=config.margin)
    paths = write_report(
        records,
        baseline,
        Path(config.out),
        baseline_accuracy=accuracy,
        margin=config.margin,
        top=config.top,
        layers=config.latency_layers,
        store_counts=stored,
        network_rows=_network(config, records, accuracy, progress),
    )
    _say(progress, f"wrote {paths['table']}, {paths['json']}, {paths['plot']} and pages in {paths['pages']}")
    counts = merged_strategy_counts(records, stored, baseline_accuracy=accuracy, margin=config.margin)
    for line in strategy_lines(counts):
        _say(progress, f"strategy {line}")
    return {
        "evaluated": len(records),
        "screened": len(evaluations.screened()),
        "strategies": counts,
        "families": family_counts(records, baseline_accuracy=accuracy, margin=config.margin),
        "baseline": baseline,
        **{k: str(v) for k, v in paths.items()},
    }


__all__: Sequence[str] = ["NETS", "DiscoverConfig", "discover", "discovery_space", "measured_reward"]

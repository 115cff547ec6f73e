"""The baseline's evaluation is cached per machine and settings: a second run reuses it and says
so, a changed layer table or proxy is a different key, and a broken cache file is measured again."""

from __future__ import annotations

import io

import pytest
from backends import backend

from kdsl import gallery
from kdsl.cli import main
from kdsl.discover import baseline_cache
from kdsl.discover.executors import Task
from kdsl.discover.loop import DiscoverConfig, Evaluations, _baseline

TINY_LAYERS = [{"name": "tiny", "N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8}]


class CountingExecutor:
    """Stands in for the worker pool: 'measures' by returning fixed metrics, counting the tasks."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []

    def map(self, tasks):
        for task in tasks:
            self.tasks.append(task)
            yield task, {"key": task.key, "status": "ok", "metrics": {"accuracy": 0.9, "latency_ms": 1.5}}


def run_baseline(tmp_path, name: str, config: DiscoverConfig, executor: CountingExecutor) -> tuple[dict, str]:
    """Store the baseline of ``config`` in a fresh database; return its stored metrics and the progress."""
    evaluations = Evaluations(str(tmp_path / f"{name}.sqlite"))
    progress = io.StringIO()
    try:
        _baseline(config, executor, evaluations, gallery.load("conv2d"), config.evaluators(), progress)
        rows = evaluations.rows("baseline")
    finally:
        evaluations.close()
    assert len(rows) == 1 and rows[0]["status"] == "ok"
    return rows[0]["metrics"], progress.getvalue()


def test_a_second_run_reuses_the_cached_baseline_and_says_so(tmp_path):
    config = DiscoverConfig(latency_layers=TINY_LAYERS, cache_dir=str(tmp_path / "cache"))
    executor = CountingExecutor()
    first, said = run_baseline(tmp_path, "first", config, executor)
    assert len(executor.tasks) == 1 and "measuring the baseline" in said and "baseline_cache" not in first
    assert len(list((tmp_path / "cache").glob("baseline-*.json"))) == 1
    second, said = run_baseline(tmp_path, "second", config, executor)
    assert len(executor.tasks) == 1  # not measured again
    assert "using the cached baseline" in said and second["accuracy"] == 0.9
    assert second["baseline_cache"]["file"].startswith(str(tmp_path / "cache"))
    # --no-baseline-cache measures it again
    run_baseline(tmp_path, "third", DiscoverConfig(**{**config.__dict__, "use_cache": False}), executor)
    assert len(executor.tasks) == 2


def test_the_key_changes_with_the_layer_table_the_proxy_and_the_latency_backend(tmp_path):
    def key(**changes) -> str:
        config = DiscoverConfig(**{"latency_layers": TINY_LAYERS, **changes})
        parts = baseline_cache.baseline_key_parts(
            config.evaluators(), proxy=config.proxy_config(), seed=config.seed, workers=config.workers
        )
        return baseline_cache.baseline_key(parts)

    same = key()
    assert same == key()
    wider = [{**TINY_LAYERS[0], "Cin": 16, "Cout": 16}]
    assert key(latency_layers=wider) != same
    assert key(latency_layers="resnet18") != key(latency_layers="resnet18_stride2")
    assert key(epochs=1) != same and key(latency_backend="torch") != same and key(workers=2) != same
    # a table is keyed by its sizes, not only by its name
    assert key(latency_layers="resnet18") == key(latency_layers=[dict(v.values, name=v.name) for v in _resnet18()])


def _resnet18():
    from kdsl.solve.layers import load_layers

    layers = load_layers("resnet18")
    assert layers
    return layers


def test_a_broken_cache_file_is_measured_again(tmp_path):
    config = DiscoverConfig(latency_layers=TINY_LAYERS, cache_dir=str(tmp_path / "cache"))
    executor = CountingExecutor()
    run_baseline(tmp_path, "first", config, executor)
    (cached,) = (tmp_path / "cache").glob("baseline-*.json")
    cached.write_text("{not json")
    _, said = run_baseline(tmp_path, "second", config, executor)
    assert len(executor.tasks) == 2 and "measuring the baseline" in said


def test_the_cache_folder_defaults_to_kdsl_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KDSL_CACHE_DIR", str(tmp_path / "env"))
    assert baseline_cache.cache_directory() == tmp_path / "env"
    monkeypatch.delenv("KDSL_CACHE_DIR")
    assert baseline_cache.cache_directory().parts[-2:] == (".cache", "kdsl")


def test_discover_device_cuda_fails_at_once_without_a_gpu(tmp_path, capsys):
    torch = backend("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the error on a machine without a GPU")
    db, out = tmp_path / "runs.sqlite", tmp_path / "out"
    code = main(["discover", "--device", "cuda", "--db", str(db), "--out", str(out), "--time-limit", "5"])
    err = capsys.readouterr().err
    assert code == 2 and "no CUDA device is visible" in err and len(err.strip().splitlines()) == 1
    assert not db.exists() and not out.exists()  # nothing was started
    with pytest.raises(SystemExit) as exit_:  # argparse refuses a backend it does not know
        main(["discover", "--latency-backend", "gpu", "--db", str(db)])
    assert exit_.value.code == 2 and "invalid choice: 'gpu'" in capsys.readouterr().err


def test_cuda_with_the_tvm_backend_is_refused_before_any_work():
    with pytest.raises(Exception, match="--latency-backend torch"):
        DiscoverConfig(device="cuda", latency_backend="tvm").evaluators()
    assert DiscoverConfig(device="cuda", latency_backend="torch").evaluators()[1]["device"] == "cuda"

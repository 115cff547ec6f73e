"""Discover trains one candidate per design, and every view of its ranking says what each candidate
is: results.md, the terminal, results.json and ``kdsl results --json`` carry the same rows."""

from __future__ import annotations

import json
from pathlib import Path

from kdsl import gallery
from kdsl.cli import main
from kdsl.discover import ranking, report
from kdsl.discover.families import FamilyTable
from kdsl.discover.loop import Evaluations, _fresh
from kdsl.lang import Output, Shift, primary
from kdsl.search.store import Store

H, W = primary("H W")


def store_with(path: Path, ops: dict[str, object], strategy: str = "neighbors") -> Path:
    """A results database holding ``ops`` (name -> operator) as valid candidates, rewarded in order."""
    store = Store(path)
    lease = store.claim("fingerprint", strategy, 0, "test")
    rows = [
        {
            "key": op.key,
            "dsl": op.to_dsl(),
            "depth": len(op.steps),
            "status": "valid",
            "reward": 1.0 - 0.1 * i,
            "strategy": strategy,
            "metrics": {"origin": name},
        }
        for i, (name, op) in enumerate(ops.items())
    ]
    store.commit(lease, rows, {}, release=True)
    store.close()
    assert path.is_file()
    return path


def grouped_with_shift_before_window():
    op = gallery.load("grouped_conv2d").with_defaults(G=2)
    steps = list(op.steps)
    steps.insert(1, Shift("H"))
    from kdsl.lang.build import Builder

    return Builder(op.inputs, tuple(steps), None, []).finish(Output("N", "Cout", "H", "W", defaults={"G": 2, "K": 3}))


def test_fresh_candidates_are_one_per_design_and_repeats_are_recorded(tmp_path):
    ops = {
        "grouped_conv2d": gallery.load("grouped_conv2d").with_defaults(G=2),
        "grouped_shifted": grouped_with_shift_before_window(),  # the same design with a Shift inserted
        "separable": gallery.load("depthwise_separable_conv2d"),
        "pointwise_conv2d": gallery.load("pointwise_conv2d"),
    }
    db = store_with(tmp_path / "runs.sqlite", ops)
    store, evaluations, families = Store(str(db)), Evaluations(str(db)), FamilyTable(str(db))
    try:
        picked = _fresh(store, evaluations, families, set(), 10)
        assert [row["key"] for row in picked] == [
            ops[n].key for n in ("grouped_conv2d", "separable", "pointwise_conv2d")
        ]
        repeat = ops["grouped_shifted"].key
        assert evaluations.screened() == {repeat: None}
        stored = families.get([repeat])[repeat]
        assert stored["kind"] == "variant" and stored["repeat_of"] == ops["grouped_conv2d"].key
        # a second look finds nothing new: repeats and picked ones are not offered again
        assert _fresh(store, evaluations, families, {row["key"] for row in picked}, 10) == []
    finally:
        store.close()
        evaluations.close()
        families.close()


def discovery_db(tmp_path: Path) -> Path:
    """A discovery database: three candidates, the baseline, and their evaluations."""
    ops = {
        "grouped_conv2d": gallery.load("grouped_conv2d").with_defaults(G=2),
        "grouped_shifted": grouped_with_shift_before_window(),
        "depthwise_separable_conv2d": gallery.load("depthwise_separable_conv2d"),
    }
    db = store_with(tmp_path / "runs.sqlite", ops)
    evaluations = Evaluations(str(db))
    try:
        evaluations.add(
            {"key": gallery.load("conv2d").key, "status": "ok", "metrics": {"accuracy": 0.96, "latency_ms": 2.0}},
            role="baseline",
        )
        for op, accuracy in zip(ops.values(), (0.955, 0.95, 0.9)):
            metrics = {"accuracy": accuracy, "latency_ratio": 0.5, "flops_ratio": 0.5, "params": 10}
            evaluations.add({"key": op.key, "status": "ok", "metrics": metrics, "seconds": 1.0})
    finally:
        evaluations.close()
    return db


def test_records_say_what_each_candidate_is_and_count_known_and_new_apart(tmp_path):
    records, _ = ranking.load_records(str(discovery_db(tmp_path)))
    lines = {r["provenance"] for r in records}
    assert "is `grouped_conv2d` (G=2, K=3)" in lines
    assert "is `depthwise_separable_conv2d` (K=3)" in lines
    assert any(line.startswith("`grouped_conv2d` (G=2, K=3) with Shift(H, 1) at step 2") for line in lines)
    assert {r["strategy"] for r in records} == {"neighbors"}
    counts = ranking.family_counts(records, baseline_accuracy=0.96, margin=0.02)
    assert counts["trained"] == {"known": 2, "variant": 1} and counts["new families"] == 0
    assert counts["usable"] == {"known": 1, "variant": 1}
    text = report.summary(records, baseline_accuracy=0.96, margin=0.02)
    assert "2 known designs, 1 known designs with shifts inserted" in text and "\\n" not in text


def test_results_json_carries_the_rows_and_fields_of_its_table(tmp_path, capsys):
    db = discovery_db(tmp_path)
    assert main(["results", "--db", str(db), "--top", "3"]) == 0
    table = capsys.readouterr().out
    assert main(["results", "--db", str(db), "--top", "3", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["columns"] == list(report.COLUMNS)
    rows = answer["table"]
    assert [set(row) for row in rows] == [set(report.COLUMNS)] * 3
    for row in rows:  # every row of the JSON is a row of the table, in the same rank
        assert f"{row['rank']:>4}  {row['key'][:16]}" in table
        assert row["what it is"] in table and row["verdict"] in table
    assert answer["families"]["trained"]["known"] == 2


def test_report_files_say_what_each_candidate_is(tmp_path):
    records, baseline = ranking.load_records(str(discovery_db(tmp_path)))
    paths = report.write_report(records, baseline, tmp_path / "out", baseline_accuracy=0.96, margin=0.02)
    markdown = paths["table"].read_text()
    assert "what it is" in markdown and "is `grouped_conv2d` (G=2, K=3)" in markdown
    assert "## By strategy" in markdown and "| neighbors | - | - | 3 | 2 | 0 | 0 |" in markdown
    results = json.loads(paths["json"].read_text())
    assert results["strategies"]["neighbors"]["trained"] == 3
    assert {row["what it is"] for row in results["table"]} == {r["provenance"] for r in records}
    pages = list(paths["pages"].glob("*.md"))
    assert pages and all("what it is" in page.read_text() for page in pages)


def test_the_report_times_the_top_families_end_to_end_when_given_rows(tmp_path):
    records, baseline = ranking.load_records(str(discovery_db(tmp_path)))
    chosen = ranking.top_families(records, baseline_accuracy=0.96, margin=0.02, count=3)
    # usable: the grouped conv and its shifted variant, one family each (the variant's differs)
    assert [r["kind"] for r in chosen] == ["known", "variant"]
    rows = [
        {
            "op": f"{chosen[0]['key']} (known)",
            "backend": "torch",
            "batch": 1,
            "ms": 50.0,
            "ratio": 0.6,
            "vs_native": 0.6,
        }
    ]
    paths = report.write_report(
        records, baseline, tmp_path / "out", baseline_accuracy=0.96, margin=0.02, network_rows=rows
    )
    markdown = paths["table"].read_text()
    assert "## End to end: ResNet-18" in markdown
    assert (
        f"| {chosen[0]['key']} (known) | is `grouped_conv2d` (G=2, K=3) | torch | 1 | 50.0 | 0.60 | 0.60 |" in markdown
    )
    assert json.loads(paths["json"].read_text())["network"] == rows


def test_every_usable_new_family_gets_a_page(tmp_path):
    from tests.test_provenance import grouped_one_by_three

    one_by_three = grouped_one_by_three()
    db = discovery_db(tmp_path)
    store_with(tmp_path / "runs.sqlite", {"new": one_by_three}, strategy="mcts")
    evaluations = Evaluations(str(db))
    metrics = {"accuracy": 0.955, "latency_ratio": 0.9, "flops_ratio": 0.2, "params": 10}
    evaluations.add({"key": one_by_three.key, "status": "ok", "metrics": metrics, "seconds": 1.0})
    evaluations.close()
    records, baseline = ranking.load_records(str(db))
    paths = report.write_report(records, baseline, tmp_path / "out", baseline_accuracy=0.96, margin=0.02, top=1)
    pages = {page.stem for page in paths["pages"].glob("*.md")}
    assert one_by_three.key in pages and len(pages) == 2  # the top one, and the new family ranked last
    assert "new (G=2, K=3): 1 weight w[g, co, ci, kw]" in (paths["pages"] / f"{one_by_three.key}.md").read_text()

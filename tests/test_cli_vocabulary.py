"""One command line: the same option names everywhere (old spellings still accepted), ``--version``,
help with defaults and a text for every option, one cost unit (MACs), operator files wherever a
gallery name goes, progress that stays readable in a log, and answers as tables unless ``--json``."""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from backends import backend

import kdsl
from kdsl import gallery
from kdsl.cli import build_parser, discover_commands, main, search_commands, tune_commands
from kdsl.runtime.progress import Progress


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def parsers(parser: argparse.ArgumentParser, name: str = "kdsl"):
    """Every (command name, parser) of the ``kdsl`` tree, the top one included."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from parsers(subparser, f"{name} {sub}")


def test_version_is_the_package_version():
    result = subprocess.run([sys.executable, "-m", "kdsl.cli", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == f"kdsl {kdsl.__version__}"


def test_every_command_has_a_description_and_every_option_a_help_text():
    missing = []
    for name, parser in parsers(build_parser()):
        if name != "kdsl" and not parser.description:
            missing.append(f"{name}: no description")
        for action in parser._actions:
            if action.help is None:  # argparse.SUPPRESS marks the hidden old spellings
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, missing


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    out = capsys.readouterr().out
    assert "(default: resnet18)" in out and "(default: enumerate)" in out and "(default: 6)" in out
    assert "seed of the sampling strategies (a run resumes per seed) (default: 0)" in " ".join(out.split())
    assert "(default: None)" not in out and "(default: False)" not in out
    assert "--coefficient" not in out  # the old spelling works but is not advertised


@pytest.mark.parametrize("spelling", ["--set", "--coefficient"])
def test_search_takes_set_like_check_and_the_old_spelling(spelling, capsys, tmp_path):
    db = str(tmp_path / "r.db")
    argv = ["search", "conv2d", "--max-depth", "3", spelling, "K=3", "--db", db, "--quiet", "--json"]
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "K in (3,)" in json.loads(out)["space"]
    code, _, err = run(capsys, "search", "conv2d", spelling, "K", "--db", db)
    assert code == 2 and err.startswith("error: --set expects NAME=V1,V2")


def test_every_count_is_in_macs(capsys, tmp_path):
    code, out, _ = run(capsys, "check", "conv2d", "--layers", "resnet18")
    assert code == 0 and "M MACs" in out and "FLOP" not in out
    # conv2d on conv2_x at batch 1: 64*64*9*56*56 MACs
    assert re.search(rf"conv2_x.*\s{64 * 64 * 9 * 56 * 56 / 1e6:.2f}\s", out)
    code, out, _ = run(capsys, "show", "squeeze_excitation")
    assert code == 0 and "MACs" in out and "flops" not in out.lower().replace("kdsl", "")
    db = str(tmp_path / "r.db")
    assert main(["search", "conv2d", "--max-depth", "3", "--set", "K=3", "--db", db, "--quiet"]) == 0
    code, out, _ = run(capsys, "results", "--db", db, "--top", "2")
    assert code == 0 and " M MACs " in out and "FLOP" not in out


def test_bench_codegen_takes_an_operator_file_and_counts_macs(capsys, tmp_path):
    backend("torch")
    backend("tvm")
    op = tmp_path / "mine.dsl"
    op.write_text(gallery.source("pointwise_conv2d"))
    layers = tmp_path / "tiny.json"
    layers.write_text(json.dumps([{"name": "tiny", "N": 1, "Cin": 4, "Cout": 4, "H": 4, "W": 4}]))
    code, out, err = run(capsys, "bench", "codegen", "--ops", str(op), "--layers", str(layers), "--batch", "1")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith(str(op)[:27]))
    assert "GMAC/s" in out and "tiny" in row
    # speeds are MACs; flops appear only where the machine's peak is stated (CPUs are rated in GFLOP/s)
    # and where the percent-of-peak column says how MACs convert (2 flops each)
    flop_lines = [line for line in out.splitlines() if "GFLOP" in line]
    assert [line.split(":")[0] for line in flop_lines] == ["machine", "%pk"]
    assert "\r" not in err and "bench codegen: 2/2 cases" in err  # a plain progress line, not a \r bar


def test_progress_in_a_log_is_whole_lines_and_a_terminal_gets_a_bar(tmp_path):
    log = tmp_path / "log.txt"
    with open(log, "w") as stream, Progress("search", unit="nodes", stream=stream, every=0) as bar:
        for step in range(3):
            bar.update(10, new=step)
    lines = log.read_text().splitlines()
    assert lines[0] == "search: started" and lines[-1].startswith("search: 30 nodes, new 2 (done in")
    assert len(lines) == 5 and "\r" not in log.read_text()

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    pytest.importorskip("tqdm")
    terminal = Terminal()
    with Progress("tune", total=4, unit="trials", stream=terminal) as bar:
        bar.update(4)
    assert "\r" in terminal.getvalue() and "4/4" in terminal.getvalue() and "100%" in terminal.getvalue()


def test_discover_says_what_it_is_doing_and_ends_with_a_table(capsys, tmp_path, monkeypatch):
    def fake_discover(config, progress):
        progress.write("measuring the baseline (conv2d): proxy accuracy and latency\n")
        progress.write("evaluated abc: ok, accuracy 0.900\n")
        return {
            "evaluated": 1,
            "screened": 2,
            "baseline": {},
            "table": "out/results.md",
            "json": "j",
            "plot": "p",
            "pages": "out/pages",
        }

    monkeypatch.setattr(discover_commands, "discover", fake_discover)
    db = tmp_path / "runs.sqlite"
    code, out, err = run(capsys, "discover", "--db", str(db), "--out", str(tmp_path / "out"))
    assert code == 0 and "measuring the baseline" in err and err.startswith("discover: started")
    assert out.startswith("kdsl discover: 1 candidates evaluated, 2 screened") and "report: out/results.md" in out
    assert "{" not in out
    code, out, _ = run(capsys, "discover", "--db", str(db), "--json")
    assert code == 0 and json.loads(out)["evaluated"] == 1


def test_check_prints_a_table_and_json_only_when_asked(capsys):
    code, table, _ = run(capsys, "check", "conv2d", "--layers", "resnet18")
    code_json, out, _ = run(capsys, "check", "conv2d", "--layers", "resnet18", "--json")
    report = json.loads(out)
    assert code == code_json == 0 and "{" not in table
    first = report["rows"][0]
    assert report["coefficients"] == {"K": [3]} and first["layer"] == "conv2_x" and len(report["rows"]) == 4
    assert first["macs"] == 64 * 64 * 9 * 56 * 56 and f"{first['macs'] / 1e6:.2f}" in table


def test_one_vocabulary_across_commands():
    commands = dict(parsers(build_parser()))
    visible = {
        name: {
            option for action in parser._actions if action.help != argparse.SUPPRESS for option in action.option_strings
        }
        for name, parser in commands.items()
    }
    # the old spellings are accepted but no command shows them
    assert not [name for name, options in visible.items() if {"--layer", "--coefficient"} & options]
    for name in ("search", "results", "check", "show", "tune", "discover", "bench codegen", "bench lowering"):
        assert "--json" in visible[f"kdsl {name}"], name
    for name in ("search", "check", "tune", "bench codegen", "bench lowering"):
        assert "--layers" in visible[f"kdsl {name}"], name
    assert "--set" in visible["kdsl search"] and "--set" in visible["kdsl check"]


def test_show_json_has_the_cost_formulas_in_macs(capsys):
    code, out, _ = run(capsys, "show", "conv2d", "--json")
    shown = json.loads(out)
    assert code == 0 and shown["key"] == gallery.load("conv2d").key
    assert shown["cost"]["macs"] == "Cin*Cout*H*K**2*N*W" and "flops" not in shown["cost"]


#: one word per thing: an old or other spelling may stay only as an alias of the word itself
CANONICAL = {
    "--max-flops": "--max-macs",
    "--min-flops": "--min-macs",
    "--seconds": "--time-limit",
    "--coefficient": "--set",
    "--layer": "--layers",
}


def test_no_flag_is_spelled_two_ways():
    """Every command's options, read from its parser (what ``--help`` prints): a flag spelled another
    way somewhere is either an alias in the same option as the word every command uses, or hidden."""
    found = []
    for name, parser in parsers(build_parser()):
        for action in parser._actions:
            for spelling in action.option_strings:
                word = CANONICAL.get(spelling)
                if word is None or word in action.option_strings or action.help == argparse.SUPPRESS:
                    continue
                found.append(f"{name}: {spelling} (say {word})")
            if action.help != argparse.SUPPRESS and action.option_strings and action.option_strings[0] in CANONICAL:
                found.append(
                    f"{name}: {action.option_strings[0]} is shown first (say {CANONICAL[action.option_strings[0]]})"
                )
    assert not found, found
    shown = {s for _, parser in parsers(build_parser()) for a in parser._actions for s in a.option_strings[:1]}
    assert {"--max-macs", "--min-macs", "--time-limit", "--set", "--layers"} <= shown


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    return dict(parsers(build_parser()))


def test_every_command_and_sub_command_prints_its_own_help(capsys):
    """Every ``--help`` of the tree, read as a user reads it: it exits 0, says its own usage, and lists
    every option that parser shows (and no other command's: ``gallery build`` has no ``--key``)."""
    commands = _command_parsers()
    assert {"kdsl gallery build", "kdsl gallery add", "kdsl gallery rediscover", "kdsl gallery list"} <= set(commands)
    for name, parser in commands.items():
        with pytest.raises(SystemExit) as stop:
            main([*name.split()[1:], "--help"])
        text = capsys.readouterr().out
        assert stop.value.code == 0 and text.startswith(f"usage: {name}"), name
        shown = {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
        assert all(option in text for option in shown), (name, sorted(o for o in shown if o not in text))
        assert "(default: )" not in text, name
    build = commands["kdsl gallery build"]
    assert not {"--key", "--restricted", "--db"} & {s for a in build._actions for s in a.option_strings}


def _normal(option: str) -> str:
    """One spelling's word: ``--time-limit``, ``--timelimit`` and ``--time_limit`` are one."""
    return option.lstrip("-").replace("-", "").replace("_", "").lower()


def _several(action: argparse.Action) -> bool:
    """Whether an option takes several values (a plural name says so: ``--layers a b``, ``--tuners``)."""
    return action.nargs in ("+", "*") or isinstance(action, (argparse._AppendAction, argparse._ExtendAction))


def spelled_two_ways(parsers_by_name: dict[str, argparse.ArgumentParser]) -> list[str]:
    """Options shown (not hidden) in the tree that name one thing two ways: the same word spelled
    differently (:func:`_normal`), a spelling :data:`CANONICAL` maps to another word (unless it is an
    alias beside that word in the same option), or a singular and a plural of one word where the
    plural does not take several values or the singular does (``--tuner X`` and ``--tuners X Y`` are fine)."""
    shown: dict[str, set[str]] = {}
    several: dict[str, bool] = {}
    found = []
    for name, parser in parsers_by_name.items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for spelling in action.option_strings:
                if spelling.startswith("--"):
                    shown.setdefault(_normal(spelling), set()).add(spelling)
                    several[spelling] = several.get(spelling, False) or _several(action)
                word = CANONICAL.get(spelling)
                if word is not None and word not in action.option_strings:
                    found.append(f"{name}: {spelling} (say {word})")
    found += [f"{' and '.join(sorted(s))} are one word" for s in shown.values() if len(s) > 1]
    for word, spellings in shown.items():
        plural = shown.get(word + "s")
        if plural and (any(several[s] for s in spellings) or not all(several[s] for s in plural)):
            found.append(f"{' and '.join(sorted(spellings | plural))}: a plural takes several values, a singular one")
    return found


def test_no_flag_is_spelled_two_ways_across_every_help():
    assert spelled_two_ways(_command_parsers()) == []


def test_the_two_ways_check_can_fail():
    """The check above on a made-up tree with each kind of slip."""
    top = argparse.ArgumentParser(prog="kdsl")
    commands = top.add_subparsers()
    one = commands.add_parser("one")
    one.add_argument("--layer")
    one.add_argument("--seconds")
    two = commands.add_parser("two")
    two.add_argument("--layers")
    two.add_argument("--time-limit", "--seconds")  # an alias beside the word: allowed
    two.add_argument("--tuner")
    two.add_argument("--tuners", nargs="+")  # one tuner, or several: both words are right
    two.add_argument("--time_limit")
    found = spelled_two_ways(dict(parsers(top)))
    assert "kdsl one: --seconds (say --time-limit)" in found and "--time-limit and --time_limit are one word" in found
    assert "--layer and --layers: a plural takes several values, a singular one" in found
    assert "kdsl one: --layer (say --layers)" in found and len(found) == 4, found


def _readme_cli_block() -> str:
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = text.split("## The command line", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert blocks, "the README's command line section has no command block"
    return blocks[0]


def readme_commands(block: str) -> list[tuple[str, set[str]]]:
    """Each ``kdsl ...`` entry of the README's block (with its indented continuation lines) as the
    command it names (the longest prefix that is a command) and the ``--flags`` it writes."""
    commands = _command_parsers()
    entries: list[tuple[str, set[str]]] = []
    for line in block.splitlines():
        if line.startswith("kdsl "):
            words = line.split()
            name = "kdsl"
            for word in words[1:]:
                if f"{name} {word}" not in commands:
                    break
                name = f"{name} {word}"
            entries.append((name, set()))
        if entries and not line.lstrip().startswith(("#",)):
            # flags up to the description (two spaces after the command text start it)
            entries[-1][1].update(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line))
    assert entries, "no kdsl command in the README's block"
    return entries


def test_the_readme_lists_every_command_and_only_flags_that_exist():
    commands = _command_parsers()
    entries = readme_commands(_readme_cli_block())
    missing_flags = []
    for name, flags in entries:
        taken = {s for a in commands[name]._actions for s in a.option_strings} | {"--help", "--version"}
        missing_flags += [f"{name} {flag}" for flag in sorted(flags - taken)]
    assert not missing_flags, missing_flags
    # every command a user can run (a parser without sub-commands of its own) has a line
    leaves = {
        name
        for name, parser in commands.items()
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions) or name == "kdsl gallery"
    }
    listed = {name for name, _ in entries}
    assert not leaves - listed, sorted(leaves - listed)
    # and a hidden old spelling is never what the README teaches
    hidden = {s for p in commands.values() for a in p._actions if a.help == argparse.SUPPRESS for s in a.option_strings}
    assert not {flag for _, flags in entries for flag in flags} & hidden


def test_the_readme_check_can_fail():
    entries = readme_commands("kdsl search SPEC --no-such-flag\nkdsl gallery build --out DIR\n")
    assert entries == [("kdsl search", {"--no-such-flag"}), ("kdsl gallery build", {"--out"})]


@pytest.mark.parametrize(
    ("argv", "spec"),
    [
        (["search", "matmul"], "matmul"),
        (["search", "--spec", "matmul"], "matmul"),
        (["search", "m", "--spec", "m"], "m"),
    ],
)
def test_search_takes_its_spec_as_discover_does(argv, spec):
    args = build_parser().parse_args(argv)
    assert search_commands.spec_from_args(args) == spec


def test_search_refuses_two_different_specs_or_none(capsys, tmp_path):
    db = str(tmp_path / "r.db")
    code, _, err = run(capsys, "search", "conv2d", "--spec", "matmul", "--db", db)
    assert code == 2 and "two specs, conv2d and --spec matmul" in err
    code, _, err = run(capsys, "search", "--db", db)
    assert code == 2 and "needs a spec" in err


def test_search_with_spec_writes_the_default_database_that_results_reads(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "search", "--spec", "conv2d", "--max-depth", "3", "--set", "K=3", "--quiet")
    assert code == 0 and "-> runs.sqlite" in out, err
    code, out, _ = run(capsys, "results", "--top", "1")
    assert code == 0 and "candidates:" in out and (tmp_path / "runs.sqlite").is_file()


def test_every_db_is_optional_and_its_help_names_its_default(capsys):
    commands = _command_parsers()
    for name, parser in commands.items():
        for action in parser._actions:
            if "--db" in action.option_strings:
                assert not action.required, name
    for name, default in [("search", "runs.sqlite"), ("results", "runs.sqlite"), ("discover", "runs.sqlite")]:
        assert commands[f"kdsl {name}"].get_default("db") == default, name
    assert commands["kdsl tune"].get_default("db") == "tune.db"
    assert commands["kdsl gallery add"].get_default("db") == "runs.sqlite"


def test_a_tuner_option_is_refused_in_the_help_s_words_before_anything_starts(capsys):
    code, _, err = run(
        capsys, "tune", "matmul", "--layers", '{"M": 4, "Cin": 8, "Cout": 8}', "--tuner-option", "wings=2"
    )
    assert code == 2 and "started" not in err
    assert "opevo has no option 'wings'; it takes lambda (parents)" in err and "rho (offspring)" in err
    code, _, err = run(capsys, "tune", "matmul", "--layers", "conv3_x", "--tuner", "random", "--tuner-option", "q=1")
    assert code == 2 and "random takes no tuner options" in err and "started" not in err
    code, _, err = run(
        capsys, "tune", "matmul", "--layers", "conv3_x", "--tuner-option", "lambda=4", "--tuner-option", "parents=2"
    )
    assert code == 2 and "lambda and parents are the same option" in err and "started" not in err


def test_tune_takes_several_layers():
    args = build_parser().parse_args(["tune", "conv2d", "--layers", "conv2_x", "conv3_x", "--layers", "conv4_x"])
    assert [name for name, _ in tune_commands.parse_layers(args.layers)] == ["conv2_x", "conv3_x", "conv4_x"]
    assert len(tune_commands.parse_layers(["resnet18"])) == 4
    with pytest.raises(kdsl.KdslError, match="conv2_x twice"):
        tune_commands.parse_layers(["conv2_x", "resnet18"])


def test_cost_has_macs_and_keeps_flops_as_its_alias():
    op = gallery.load("conv2d")
    layer = {"N": 1, "Cin": 8, "Cout": 8, "H": 4, "W": 4}
    found = kdsl.solve.cost(op, layer)
    assert found["macs"] == found["flops"] == 8 * 8 * 9 * 4 * 4
    assert kdsl.solve.cost(op, layer, metrics=("macs",)).keys() == {"macs", "flops"}
    totals = kdsl.solve.total_cost(op, "resnet18")
    assert totals["macs"] == totals["flops"] > 0


def test_progress_lines_show_counts_and_rounded_seconds():
    stream = io.StringIO()
    with Progress("discover", total=60.0, unit="s", stream=stream, every=0) as bar:
        bar.set(14.040596484000048)
    lines = stream.getvalue().splitlines()
    assert lines[1].startswith("discover: 14 s / 60 s (") and "14.04" not in stream.getvalue()
    stream = io.StringIO()
    with Progress("tune", total=64, unit="trials", stream=stream, every=0) as bar:
        bar.update(3)
    assert stream.getvalue().splitlines()[1].startswith("tune: 3/64 trials (")

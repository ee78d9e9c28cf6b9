"""A study is one module: this file declares a toy one as a module of studies/ does (its `Study` with declared
variants, its command's options and run, a summary written from its committed per-run CSV, its comparison report
checked section by section) and registers it, and the lab's command line, reports and study list find it, with no
edit anywhere else. Studies run with Python values (`run_study`); the toy runs on 2 seeds of the demo data.

The registrations go into scratch copies of the registries (`toy` fixture), so that the other tests see the lab
as committed."""

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.comparison_outcomes import TINY, assessed_outcomes, report_context
from helpers.registries import scratch_entries
from studies import (
    COMMANDS,
    STUDIES,
    Command,
    Study,
    command,
    load_lab,
    register_command,
    register_study,
    reports,
    run_study,
)
from studies import study as study_module
from studies.cli import main, usage
from studies.command import comparison_flags, run_or_report
from studies.comparison import loss_variants, read_runs_csv
from studies.comparison.report import write_report
from studies.data import SceneData

# The toy benchmark: `clip` and `siglip` on the demo scenes at the tiny budget, two seeds, no pre-registration.
TOY = Study(
    name="toy_demo",
    data=SceneData(),
    recipe=None,
    variants=loss_variants("clip", "siglip"),
    seeds=(0, 1),
    preregistration=None,
    endpoints=(),
    report="docs/results/toy_demo.md",
    budget=TINY,
)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--summary", action="store_true", help="<results-dir>/toy_demo_summary.md from the CSV")
    comparison_flags(parser, "runs/toy", "default: the registered seeds (0-1)")


def run(args: argparse.Namespace) -> None:
    if args.summary:
        write_summary(args.results_dir.parent)
        return
    run_or_report([STUDIES.get(TOY.name)], args)


def write_summary(docs: Path) -> list:
    """<docs>/results/toy_demo_summary.md: each variant's mean val R@1 over its ok runs, from the per-run CSV."""
    outcomes = read_runs_csv(docs / "results" / "toy_demo_runs.csv")
    page = docs / "results" / "toy_demo_summary.md"
    lines = ["# Toy: mean val R@1 (image to text)", ""]
    for label in dict.fromkeys(outcome["label"] for outcome in outcomes):
        values = [r["metrics"]["val/i2t_R@1"] for r in outcomes if r["label"] == label and r["verdict"] == "ok"]
        lines.append(f"- `{label}`: {statistics.fmean(values):.3f}" if values else f"- `{label}`: no ok run")
    page.write_text("\n".join(lines) + "\n")
    return [page]


@pytest.fixture
def toy(monkeypatch):
    """The toy registered as its module would register it, into registries this test throws away (the lab's own
    registered first: a module imported while the copies stand would register into them only)."""
    load_lab()
    scratch_entries(monkeypatch, STUDIES)
    scratch_entries(monkeypatch, COMMANDS)
    register_study(TOY)
    register_command(Command("toy", __doc__, run, options, reports=write_summary, section_reports={TOY.name: None}))
    return TOY


def test_a_study_is_registered_once_under_its_own_name_with_declared_variants(toy):
    assert STUDIES.get("toy_demo") is toy
    with pytest.raises(ValueError, match="already registered"):
        register_study(toy)
    with pytest.raises(ValueError, match="register it under its own name"):
        STUDIES.add("another_name", replace(toy, name="toy_elsewhere"))
    with pytest.raises(ValueError, match="unknown loss"):
        loss_variants("clip", "nosuch")
    with pytest.raises(ValueError, match="its variants are LossVariant values"):
        register_study(replace(toy, name="toy_string", variants="clip,siglip"))
    with pytest.raises(ValueError, match="lists a variant twice"):
        register_study(replace(toy, name="toy_twice", variants=(*toy.variants, toy.variants[0])))


def test_the_command_line_finds_the_toy_command_and_runs_its_study_with_values(toy, tmp_path, monkeypatch, capsys):
    listed = usage()
    assert ",toy}" in listed and "\n  toy           A study is one module:" in listed and ",glyphs," in listed
    with pytest.raises(SystemExit) as help_exit:
        main(["toy", "--help"])
    assert help_exit.value.code == 0 and "--summary" in capsys.readouterr().out
    calls = []
    monkeypatch.setattr(command, "run_study", lambda study, seeds, **given: calls.append((study, seeds, given)))
    main(["toy", "--seeds", "0-1", "--losses", "siglip", "--output-dir", str(tmp_path)])
    ((study, seeds, given),) = calls
    assert (study, seeds, given["output_root"], given["losses"]) == (toy, [0, 1], tmp_path, "siglip")
    assert given["command"] == f"python -m studies toy --seeds 0-1 --losses siglip --output-dir {tmp_path}"


def test_the_list_names_the_toy_study_beside_the_registered_ones(toy, capsys):
    main(["list"])
    listed = capsys.readouterr().out
    assert "toy_demo: recipe None, clip,siglip, seeds 0-1, report docs/results/toy_demo.md" in listed
    assert "glyphs_finetune_gold: recipe glyphs-finetune-gold," in listed and "margins_transfer: " in listed


def test_the_reports_write_the_toys_summary_and_check_its_report_section_by_section(toy, tmp_path):
    """`python -m studies reports` runs the toy's writer, and its comparison report is among the section reports:
    a report the comparison wrote is what its per-run CSV renders, as the committed ones are checked."""
    results = tmp_path / "docs" / "results"
    write_report(assessed_outcomes(), report_context(tmp_path), results / "toy_demo.md", tmp_path / "out")
    assert reports.write_reports(tmp_path / "docs", only=["toy"]) == [results / "toy_demo_summary.md"]
    assert (results / "toy_demo_summary.md").read_text().splitlines()[2:] == [
        "- `A`: 0.320",
        "- `B`: 0.220",
        "- `C`: no ok run",
        "- `D`: 0.100",
    ]
    main(["reports", "--docs", str(tmp_path / "docs"), "--commands", "toy"])
    assert reports.section_reports()["toy_demo"] is None and "controls" in reports.section_reports()
    page = results / "toy_demo.md"
    committed = "## Summary" + page.read_text().split("\n## Summary", 1)[1]
    again = reports.sections_again(page, reports.registration_of(reports.section_reports()["toy_demo"]))
    assert again.rstrip("\n") == committed.rstrip("\n")
    register_command(replace(COMMANDS.get("toy"), name="toy_again", reports=None))
    with pytest.raises(ValueError, match="names section reports another command names"):
        reports.section_reports()


def test_run_study_passes_values_to_the_comparison(tmp_path, monkeypatch):
    """The transfer cell: its recipe's flags, its common pretraining as `pretrained` (no flag inside a string),
    its registration cited as the repository names it, its report under results_dir."""
    from studies import clone_study

    calls = []
    monkeypatch.setattr(study_module, "pretrain", lambda pretraining, root: root / "pretrain" / pretraining.name)
    monkeypatch.setattr(study_module, "run_comparison", lambda *args, **kwargs: calls.append((args, kwargs)) or [])
    transfer = replace(STUDIES.get("transfer"), data=SceneData())  # the scenes the comparison writes itself
    run_study(transfer, [3], output_root=tmp_path, results_dir=tmp_path / "results", losses="adacl,clip", jobs=1)
    ((variants, seeds, budget), given) = calls[0]
    assert [variant.label for variant in variants] == ["clip", "adacl"] and seeds == [3]
    assert budget.trainer_values["pretrained"] == str(tmp_path / "pretrain" / "clip-even-seed1000")
    assert budget.trainer_values["train_group_size"] == 8 and budget.jobs == 1
    assert given["output_dir"] == tmp_path / "transfer" and given["results_md"] == tmp_path / "results" / "transfer.md"
    assert given["preregistration"].source == f"{clone_study.PREREGISTRATION}#transfer"
    with pytest.raises(ValueError, match="not variants of transfer"):
        run_study(transfer, [3], output_root=tmp_path, losses="glofnd")


@pytest.mark.slow  # about 50 s on 2 cores: writes the tiny demo data, trains and evaluates 4 runs
def test_the_toy_study_runs_on_two_seeds_of_the_demo_data(toy, tmp_path):
    outcomes = run_study(toy, output_root=tmp_path, results_dir=tmp_path / "docs" / "results", echo=str)
    assert [(outcome["label"], outcome["seed"], outcome["status"]) for outcome in outcomes] == [
        ("clip", 0, "ok"),
        ("siglip", 0, "ok"),
        ("clip", 1, "ok"),
        ("siglip", 1, "ok"),
    ]
    page = tmp_path / "docs" / "results" / "toy_demo.md"
    assert "| `clip` |" in page.read_text() and page.with_name("toy_demo_runs.csv").is_file()
    assert (tmp_path / "toy_demo" / "comparison.json").is_file() and (tmp_path / "data" / "manifest.json").is_file()
    main(["toy", "--summary", "--results-dir", str(page.parent)])
    assert page.with_name("toy_demo_summary.md").read_text().startswith("# Toy: mean val R@1")
    committed = "## Summary" + page.read_text().split("\n## Summary", 1)[1]
    assert reports.sections_again(page, reports.registration_of(None)).rstrip("\n") == committed.rstrip("\n")

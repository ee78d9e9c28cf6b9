"""A study is data: registered once under its name, run with Python values (`run_study`), and a new benchmark is
one module plus one registry entry, as the toy study below is, run on 2 seeds of the demo data."""

from dataclasses import replace
from pathlib import Path

import pytest

from helpers.comparison_outcomes import TINY
from training.studies import STUDIES, Study, register_study, run_study
from training.studies import study as study_module
from training.studies.data import SceneData

# The toy benchmark: `clip` on the demo scenes at the tiny budget, two seeds, no pre-registration.
TOY = register_study(
    Study(
        name="toy_demo",
        data=SceneData(),
        recipe=None,
        variants="clip",
        seeds=(0, 1),
        preregistration=None,
        endpoints=(),
        report="docs/results/toy_demo.md",
        budget=TINY,
    )
)


def test_a_study_is_registered_once_under_its_own_name():
    assert STUDIES.get("toy_demo") is TOY
    with pytest.raises(ValueError, match="already registered"):
        register_study(TOY)
    with pytest.raises(ValueError, match="register it under its own name"):
        STUDIES.add("another_name", replace(TOY, name="toy_elsewhere"))
    with pytest.raises(ValueError, match="unknown loss"):
        register_study(replace(TOY, name="toy_bad_variant", variants="clip,nosuch"))


def test_run_study_passes_values_to_the_comparison(tmp_path, monkeypatch):
    """The transfer cell: its recipe's flags, its common pretraining as `pretrained` (no flag inside a string),
    its registration cited as the repository names it, its report under results_dir."""
    from training.studies import clone_study

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


@pytest.mark.slow  # about 35 s on 2 cores: writes the tiny demo data, trains and evaluates 2 runs
def test_the_toy_study_runs_on_two_seeds_of_the_demo_data(tmp_path):
    outcomes = run_study(STUDIES.get("toy_demo"), output_root=tmp_path, results_dir=tmp_path / "results", echo=str)
    assert [(outcome["label"], outcome["seed"], outcome["status"]) for outcome in outcomes] == [
        ("clip", 0, "ok"),
        ("clip", 1, "ok"),
    ]
    report = (tmp_path / "results" / "toy_demo.md").read_text()
    assert "| `clip` |" in report and Path(tmp_path / "results" / "toy_demo_runs.csv").is_file()
    assert (tmp_path / "toy_demo" / "comparison.json").is_file() and (tmp_path / "data" / "manifest.json").is_file()


def test_the_list_command_names_every_registered_study(capsys):
    from training.studies.cli import main

    main(["list"])
    listed = capsys.readouterr().out
    assert "toy_demo: recipe None, clip, seeds 0-1, report docs/results/toy_demo.md" in listed
    assert "glyphs_finetune_gold: recipe glyphs-finetune-gold," in listed and "margins_transfer: " in listed

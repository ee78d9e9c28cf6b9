"""The command line refuses a budget that cannot run and a report without runs, before writing anything."""

import pytest

from studies.comparison.cli import main


def test_the_command_line_rejects_a_bad_budget_and_a_report_without_runs(tmp_path):
    with pytest.raises(ValueError, match="less than one batch"):
        main(["--num-train", "16", "--batch-size", "32", "--output-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="unknown loss"):
        main(["--losses", "clip,nosuch", "--output-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="run the comparison into --output-dir"):
        main(["--report-only", "--output-dir", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_train_args_add_to_a_recipes_flags_instead_of_replacing_them():
    """--recipe's own trainer flags (caption key, family grouping) stay when --train-args adds e.g. --pretrained."""
    from studies.comparison.cli import build_parser, resolve_budget

    args = build_parser().parse_args(
        ["--recipe", "glyphs-finetune-weak", "--train-args", "--pretrained x.pt", "--caption-key", "txt_alt"]
    )
    values = resolve_budget(args).trainer_values
    # The recipe's own, --train-args's and --caption-key's, which wins over the recipe's txt_weak; as values.
    assert values == {"train_group_size": 8, "val_caption_key": "txt", "caption_key": "txt_alt", "pretrained": "x.pt"}


def test_a_recorded_budget_reads_back_as_values_also_when_it_recorded_an_argv():
    """comparison.json outcomes the budget's trainer flags as values; one that recorded them as an argv
    (`train_args`) reads back to the same budget, so its report can be rebuilt."""
    from dataclasses import asdict, replace

    from studies.comparison.data import QUICK, Budget

    budget = replace(
        QUICK.with_recipe("clone-pseudo"),
        trainer_values={**QUICK.with_recipe("clone-pseudo").trainer_values, "pretrained": "x.pt"},
    )
    recorded = asdict(budget)
    assert Budget.from_saved(recorded) == budget
    as_argv = {key: value for key, value in recorded.items() if key != "trainer_values"}
    as_argv["train_args"] = [
        "--train-group-size",
        "8",
        "--caption-key",
        "txt_pseudo",
        "--val-caption-key",
        "txt",
        "--pretrained",
        "x.pt",
    ]
    assert Budget.from_saved(as_argv) == budget

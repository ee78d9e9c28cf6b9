"""The command line refuses a budget that cannot run and a report without runs, before writing anything."""
import pytest

from training.loss_comparison.cli import main


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
    from training.loss_comparison.cli import build_parser, resolve_budget

    args = build_parser().parse_args(["--recipe", "glyphs-finetune-weak", "--train-args", "--pretrained x.pt",
                                      "--caption-key", "txt_alt"])
    train_args = resolve_budget(args).train_args
    assert train_args[-2:] == ("--pretrained", "x.pt")
    for flag, value in (("--train-group-size", "8"), ("--val-caption-key", "txt"), ("--caption-key", "txt_weak")):
        assert train_args[train_args.index(flag) + 1] == value
    last = len(train_args) - 1 - train_args[::-1].index("--caption-key")  # given later than the recipe's: it wins
    assert train_args[last + 1] == "txt_alt"

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

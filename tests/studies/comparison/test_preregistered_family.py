"""The secondary family the report tests is exactly the one docs/preregistration.md registers."""

import re
from pathlib import Path

from helpers.comparison_outcomes import outcome
from studies.comparison.findings import SECONDARY_FAMILY, secondary_keys
from studies.comparison.stats import summarize

PREREGISTRATION = Path(__file__).resolve().parents[3] / "docs" / "preregistration.md"


def test_the_family_is_the_registered_list_of_metric_names():
    text = PREREGISTRATION.read_text()
    (line,) = [line for line in text.splitlines() if line.strip().startswith("`clone/color`, ")]
    assert tuple(re.findall(r"`([^`]+)`", line)) == SECONDARY_FAMILY


def test_a_registered_study_tests_its_family_and_never_logit_margins():
    metrics = {
        f"clone/{edit}{suffix}": 0.5
        for edit in ("color", "shape", "size", "relation")
        for suffix in ("", "_cos_margin", "_cos_margin_p10", "_margin")
    }
    outcomes = [{**outcome("clip", **metrics, **{"cls/scenes_color/acc1": 0.5}), "verdict": "ok"}]
    summaries = summarize(outcomes)
    assert secondary_keys(summaries, registered=True) == [
        key for key in SECONDARY_FAMILY if key in outcomes[0]["metrics"]
    ]
    unregistered = secondary_keys(summaries, registered=False)
    assert "clone/shape_cos_margin" in unregistered and "cls/scenes_color/acc1" in unregistered
    assert not [key for key in unregistered if key.endswith("_margin") and not key.endswith("_cos_margin")]

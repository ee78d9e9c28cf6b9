"""`studies.loss_table`: the registered variants parse as losses with the registered discoveries, the
registration resolves, and the shares page scores each variant against the oracle as registered."""

from pathlib import Path

from studies import loss_table

REPO = Path(__file__).resolve().parents[2]


def test_the_variants_are_the_registered_ones_and_each_parses_as_a_loss():
    from open_clip_adacl.clone_signals import SIGNALS

    labels = [variant.label for variant in loss_table.variants(4)]
    assert labels == [
        "clip",
        "oracle:weight=4",
        "adacl",
        "adacl:mode=literal",
        "adaclw:weight=4",
        "adaclw:weight=4,discovery=features",
        "adaclw:weight=4,discovery=tokens",
        "adaclw:weight=4,discovery=text_image_tokens",
        "adaclw:weight=4,discovery=persistence_text_image_tokens",
    ]
    assert set(loss_table.DISCOVERIES) <= set(SIGNALS)


def test_the_table_resolves_its_registration_with_the_headroom_endpoint():
    study = loss_table.loss_table_study("finetune-gold-short", 16)
    registration = study.registration()
    assert registration.metrics == (loss_table.ENDPOINT,) and registration.reference == "clip"
    assert registration.source == "docs/preregistration_headroom.md#discovery_loss_table"
    assert study.seeds == tuple(range(25, 35)) and study.recipe == "glyphs-finetune-gold-short"


def test_the_registered_table_runs_in_the_cell_the_headroom_calibration_froze():
    from studies.study import STUDIES, labels_of

    study = STUDIES.get(loss_table.NAME)
    assert study.recipe == "glyphs-finetune-gold-long-16fam"
    assert "oracle:weight=16" in labels_of(study)


def _outcomes(values: dict) -> list:
    return [
        {"label": label, "seed": seed, "verdict": "ok", "metrics": {loss_table.ENDPOINT: value}}
        for label, per_seed in values.items()
        for seed, value in enumerate(per_seed)
    ]


def test_the_shares_page_marks_the_goal_only_where_half_the_gain_is_resolved_above_zero():
    clip = [0.50, 0.52, 0.49, 0.51, 0.50, 0.53]
    values = {
        "clip": clip,
        "oracle:weight=4": [c + g for c, g in zip(clip, (0.06, 0.07, 0.05, 0.06, 0.065, 0.055))],
        "adaclw:weight=4,discovery=features": [c + g for c, g in zip(clip, (0.04, 0.045, 0.035, 0.04, 0.042, 0.038))],
        "adaclw:weight=4": [c + g for c, g in zip(clip, (0.01, -0.01, 0.0, 0.005, -0.005, 0.002))],
    }
    lines = loss_table.summary_lines(_outcomes(values), "finetune-gold-short", 4)
    rows = {line.split(" | ")[0].strip("| `"): line for line in lines if line.startswith("| `")}
    assert "**goal met**" in rows["adaclw:weight=4,discovery=features"]
    assert "+67% [" in rows["adaclw:weight=4,discovery=features"]
    assert "goal met" not in rows["adaclw:weight=4"]
    assert "not run" in rows["adacl"] and "not run" in rows["adaclw:weight=4,discovery=tokens"]
    assert rows["oracle:weight=4"].split(" | ")[4] == "-"  # the oracle is the denominator, not scored


def test_the_committed_shares_page_is_what_the_committed_per_run_csv_gives():
    from studies.comparison import read_runs_csv

    results = REPO / "docs" / "results"
    outcomes = read_runs_csv(results / f"{loss_table.NAME}_runs.csv")
    lines = loss_table.summary_lines(outcomes, loss_table.FROZEN_CELL, loss_table.FROZEN_WEIGHT)
    assert "\n".join(lines) + "\n" == (results / f"{loss_table.NAME}_shares.md").read_text()

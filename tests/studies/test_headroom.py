"""`studies.headroom`: every cell has its recipe and registration and is a registered study starting from
the glyph benchmark's common checkpoint, the bar is judged as registered, and the summary page is what the
committed per-run CSVs give."""

import re
from pathlib import Path

import pytest

from studies import STUDIES, headroom

REPO = Path(__file__).resolve().parents[2]


def test_every_headroom_cell_has_its_recipe_and_registration():
    from studies.comparison.preregistration import resolve
    from training.trainer.launch.recipes import recipe_values

    steps = {}
    for cell in headroom.CELLS:
        values = recipe_values(f"glyphs-{cell}", world_size=1)
        assert values["train_group_size"] == 8 and values["lr"] == 5e-4
        assert values["caption_key"] == ("txt_weak" if "weak" in cell else "txt")
        steps[cell] = values["epochs"] * 6144 // values["batch_size"]
        registration = resolve(f"{REPO / headroom.PREREGISTRATION}#{headroom.study_name(cell)}", None, None, None)
        assert registration.metrics == (headroom.ENDPOINT,) and registration.reference == "clip"
    assert steps == {
        "finetune-gold-long": 768,
        "finetune-gold": 384,
        "finetune-weak-long": 768,
        "finetune-gold-long-16fam": 384,
        "finetune-gold-short": 192,
    }


def _records(family: dict) -> list:
    return [
        {"label": label, "seed": seed, "verdict": "ok", "metrics": {"clone/family_without_mark": value}}
        for label, values in family.items()
        for seed, value in enumerate(values)
    ]


def test_the_bar_needs_clip_at_twice_chance_and_an_oracle_gain_of_five_points_above_zero():
    clip = (0.40, 0.42, 0.41, 0.40, 0.42)
    met = headroom.bar_outcome(
        _records({"clip": clip, "oracle:weight=16": (0.46, 0.47, 0.47, 0.46, 0.47)}), "oracle:weight=16", 0.195
    )
    assert met["met"] and met["difference"].mean == pytest.approx(0.056, abs=1e-4) and met["interval"][0] > 0
    assert headroom.bar_text(met) == "**yes**"
    small = headroom.bar_outcome(
        _records({"clip": clip, "oracle:weight=16": (0.44, 0.46, 0.45, 0.44, 0.46)}), "oracle:weight=16", 0.195
    )
    assert small["learns"] and not small["gains"] and not small["met"]  # +0.04
    unlearned = headroom.bar_outcome(
        _records({"clip": clip, "oracle:weight=16": (0.46, 0.47, 0.47, 0.46, 0.47)}), "oracle:weight=16", 0.21
    )
    assert not unlearned["learns"] and unlearned["gains"] and not unlearned["met"]  # 0.41 < 2 x 0.21
    few = headroom.bar_outcome(
        _records({"clip": clip[:3], "oracle:weight=16": (0.5, 0.53, 0.51)}), "oracle:weight=16", 0.195
    )
    assert few["learns"] and few["gains"] and not few["met"]
    assert headroom.bar_text(few) == "not judged (3 of 5 pairs)"


def test_each_cell_is_a_registered_study_under_the_headroom_registration():
    for cell in headroom.CELLS:
        study = STUDIES.get(headroom.study_name(cell))
        first = cell in ("finetune-gold-long", "finetune-gold")  # ran before the amendment added oracle:weight=4
        assert study.variants == (headroom.FIRST_CONTROLS if first else headroom.CONTROLS)
        assert study.recipe == f"glyphs-{cell}"
        assert study.seeds == (20, 21, 22, 23, 24) and study.pretraining.recipe == "glyphs-pretrain"
        assert study.pretraining.seed == 1000 and study.report == f"docs/results/{study.name}.md"
        registration = study.registration()
        assert registration.metrics == (headroom.ENDPOINT,) and registration.reference == "clip"
        assert registration.source == f"docs/preregistration_headroom.md#{study.name}"


def test_the_summary_page_is_what_the_committed_csvs_give_at_the_chance_the_data_gives():
    """headroom.md's table from the committed per-run CSVs; the chance level is the glyph data's (its sibling
    counts, written by the command, not committed), taken here as the page states it."""
    results = REPO / "docs" / "results"
    page = (results / "headroom.md").read_text()
    chance = float(re.search(r"chance (\d\.\d{3}) \(the mean over", page).group(1))
    assert "\n".join(headroom.summary_lines(results, chance, headroom.CELLS)) + "\n" == page

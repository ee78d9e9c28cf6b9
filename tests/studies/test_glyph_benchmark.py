"""The glyph benchmark as registered studies: each cell's recipe, registration and pretraining, its command,
and the summary's two verdict readings and mechanism column."""

from studies import STUDIES, cli, command, glyph_benchmark
from studies.comparison.report import write_runs_csv
from training.trainer.launch.recipes import recipe_values


def test_every_glyph_cell_is_a_study_with_its_recipe_and_registration():
    for cell in glyph_benchmark.CELLS:
        values = recipe_values(f"glyphs-{cell}", world_size=1)
        assert values["train_group_size"] == 8 and values["epochs"] == 4
        assert values["caption_key"] == ("txt" if cell.endswith("gold") else "txt_weak")
        for calibrate in (True, False):
            study = STUDIES.get(glyph_benchmark.study_name(cell, calibrate))
            registration = study.registration()
            assert registration.metrics == (glyph_benchmark.ENDPOINT,) and registration.margin == 0.02
            assert study.recipe == f"glyphs-{cell}" and (study.pretraining is not None) == cell.startswith("finetune")
    pretraining = glyph_benchmark.PRETRAINING
    assert recipe_values(pretraining.recipe, world_size=1)["loss"] == "clip" and pretraining.seed == 1000
    assert STUDIES.get("glyphs_finetune_gold").seeds == tuple(range(10, 20))


def test_the_glyph_command_runs_the_cells_studies_with_values(tmp_path, monkeypatch):
    """`glyphs --cells finetune-gold --seeds 10-12` runs that registered study on those seeds, passing values."""
    calls = []
    monkeypatch.setattr(command, "run_study", lambda study, seeds, **given: calls.append((study.name, seeds, given)))
    cli.main(["glyphs", "--cells", "finetune-gold", "--seeds", "10-12", "--output-dir", str(tmp_path)])
    ((name, seeds, given),) = calls
    assert (name, seeds, given["output_root"]) == ("glyphs_finetune_gold", [10, 11, 12], tmp_path)
    assert given["command"] == "python -m studies glyphs --cells finetune-gold --seeds 10-12 --output-dir " + str(
        tmp_path
    )


def test_the_glyph_summary_gives_both_verdicts_and_the_share_of_the_oracles_gain(tmp_path):
    bench = glyph_benchmark
    family = {
        "clip": (0.20, 0.22, 0.21),
        bench.ORACLE: (0.24, 0.26, 0.25),
        "adaclw": (0.22, 0.24, 0.23),
        "adacl": (0.22, 0.24, 0.23),
    }
    outcomes = [
        {
            "label": label,
            "loss": label.split(":")[0],
            "options": {},
            "seed": seed,
            "name": f"{label}-{seed}",
            "code": "git 0123456789",
            "verdict": "ok",
            "reasons": [],
            "metrics": {
                bench.ENDPOINT: value + 0.001 * seed * (label != "clip"),
                "clone/overall": 0.8,
                **({"adacl/modulated": 0.5} if label.startswith("adacl") else {}),
            },
        }
        for label, values in family.items()
        for seed, value in enumerate(values)
    ]
    write_runs_csv(outcomes, tmp_path / f"{bench.study_name('finetune-gold', False)}_runs.csv")
    text = "\n".join(bench.summary_lines(tmp_path, ["finetune-gold"]))
    oracle_row = next(line for line in text.splitlines() if line.startswith(f"| `{bench.ORACLE}`"))
    assert "| helps | helps | 100% |" in oracle_row and "+0.041" in oracle_row  # above 0 and above +0.02
    adaclw_row = next(line for line in text.splitlines() if line.startswith("| `adaclw`"))
    assert "| helps | inconclusive | 51% |" in adaclw_row  # +0.021 of the oracle's +0.041; 95% interval not past 0.02
    # the mechanism column reads what the loss declares (`Loss.mechanism_stats`): adacl's, none for adaclw
    adacl_row = next(line for line in text.splitlines() if line.startswith("| `adacl` |"))
    assert adacl_row.endswith("| modulated 0.5 |") and adaclw_row.endswith("| - |") and oracle_row.endswith("| - |")
    assert "| `scratch-weak` | not run |" in text

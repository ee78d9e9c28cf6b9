"""The clone study as registered studies: its cells' data and pretraining, RESULTS.md assembled from the cell
reports, the controls and margin studies with their own registrations."""

import json
from pathlib import Path

import pytest

from studies import STUDIES, clone_study
from studies.cli import main
from studies.study import labels_of


def _train_geometries(root):
    """The set of training scenes' geometries (each object's position and radius, colour and shape left out)."""
    import tarfile

    geometries = set()
    for shard in sorted((root / "train").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    scene = json.loads(tar.extractfile(member).read())["scene"]
                    geometries.add(tuple(sorted((o["x"], o["y"], o["radius"]) for o in scene["objects"])))
    return geometries


def test_the_transfer_cell_pretrains_on_other_geometry_than_it_fine_tunes_on(tmp_path):
    from dataclasses import replace

    from training.synthetic_scenes.scenes import SceneConfig
    from training.synthetic_scenes.writers import write_demo_dataset

    transfer = clone_study.CELLS["transfer"]

    def scenes(seed, combinations):
        root = tmp_path / f"{combinations}-{seed}"
        write_demo_dataset(
            root,
            seed=seed,
            num_train=64,
            num_val=8,
            num_test=8,
            shard_size=64,
            config=replace(SceneConfig(), combinations=combinations),
        )
        return _train_geometries(root)

    fine_tuning = scenes(0, transfer.combinations)
    assert clone_study.TRANSFER_PRETRAIN_DATA_SEED != 0
    assert not scenes(clone_study.TRANSFER_PRETRAIN_DATA_SEED, transfer.pretrain_combinations) & fine_tuning
    # One data seed for both halves (the earlier design) repeats the geometry, recoloured: the check can fail.
    assert scenes(0, transfer.pretrain_combinations) & fine_tuning


def test_clone_study_assembles_results_from_the_cell_reports(tmp_path):
    from studies.comparison import KEEP_MARKER

    results = tmp_path / "results"
    results.mkdir()
    (results / "scratch.md").write_text(
        "# Loss comparison results\n\n- seeds 0, 1\n- every run also gets `--train-group-size 8`\n\n"
        "## Summary\n\n| variant | runs |\n|---|---|\n| `clip` | 2/2 ok |\n\n![plot](scratch.png)\n\n"
        "## Paired against `clip`\n\n`adacl` vs `clip`: no paired difference excludes 0.\n\n"
        "## Flagged runs\n\nNone.\n"
    )
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text(f"old\n\n{KEEP_MARKER}\n\n## Hand-written\n")
    runs = tmp_path / "runs"
    (runs / "scratch").mkdir(parents=True)
    (runs / "scratch" / "comparison.json").write_text(json.dumps({"labels": ["clip", "adacl"]}))
    (runs / "data").mkdir()
    likeness = {
        "shared_in_split": 1.0,
        "shared_in_family": 0.473,
        "family_duplicate_pairs": 0.167,
        "sibling_word_distance": 0.83,
        "sibling_within_one_word": 0.931,
    }
    (runs / "data" / "manifest.json").write_text(
        json.dumps({"train_caption_likeness": {"txt": {**likeness, "shared_in_split": 0.359}, "txt_pseudo": likeness}})
    )
    text = clone_study.assemble(list(clone_study.CELLS), results, results_md, runs, "python -m studies clone")
    assert "## Scratch: clone-dense batches, gold captions (`scratch`)" in text
    # what the cell registers but the comparison did not run, and the cells not run at all, are said
    assert "not run yet in this cell: `adacl:preset=paper`, `adacl:candidate_region=all`" in text
    assert "Not run yet: `python -m studies clone --cells pseudo` runs it." in text
    # each cell prints the likeness of gold captions and of what it trains on: scratch trains on gold only
    assert "`txt`: 35.9% of training images share their exact caption with another image" in text
    assert "`txt_pseudo`" not in text
    assert clone_study.cell_caption_keys(clone_study.CELLS["pseudo"]) == ("txt", "txt_pseudo")
    assert "- every run also gets `--train-group-size 8`" in text and "| `clip` | 2/2 ok |" in text
    assert "![plot](results/scratch.png)" in text  # links follow the page into results/
    assert "no paired difference excludes 0" in text and "Flagged" not in text
    written = results_md.read_text()
    assert written.startswith("# Results: the clone-negative study") and written.endswith("## Hand-written\n")


def test_clone_study_controls_are_their_own_study_with_their_own_registration(tmp_path):
    controls = STUDIES.get("controls_pseudo")
    assert labels_of(controls) == ["clip", "oracle:weight=16", "hnnce", "adacl"] and controls.seeds == (0, 1, 2, 3, 4)
    assert controls.report == "docs/results/controls_pseudo.md" and controls.recipe == "clone-pseudo"
    registration = controls.registration()
    assert (registration.endpoint, registration.metrics) == ("color_endpoint", ("clone/color",))
    assert registration.source == "docs/preregistration.md#controls_pseudo"
    assert STUDIES.get("controls_transfer").registration().metrics == ("clone/shape",)
    assert STUDIES.get("transfer").pretraining.name == "clip-even-seed1000"
    # The scratch cell's controls are the controls study, which this command does not run.
    with pytest.raises(SystemExit):
        main(["clone", "--controls", "--cells", "scratch", "--output-dir", str(tmp_path / "runs")])


def test_the_margin_study_reads_its_own_registrations_and_runs_only_in_transfer(tmp_path, capsys):
    margins = STUDIES.get("margins_transfer")
    assert margins.endpoints == clone_study.MARGIN_ENDPOINTS and margins.seeds == tuple(range(10, 20))
    for endpoint in margins.endpoints:
        registration = margins.registration(endpoint)
        assert registration.source == f"docs/preregistration_margins.md#{endpoint}" and registration.reference == "clip"
    assert margins.report_path("margins_transfer_shape") == Path("docs/results/margins_transfer_shape.md")
    with pytest.raises(SystemExit, match="--margins is the transfer cell's study"):
        main(["clone", "--margins", "--cells", "scratch", "--output-dir", str(tmp_path / "runs")])

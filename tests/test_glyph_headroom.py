"""scripts/glyph_headroom.py: every registered cell has its recipe and registration, the loss comparison gets
the glyph benchmark's arguments under the headroom registration, and the bar is judged as registered."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _headroom(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("glyph_headroom", REPO / "scripts" / "glyph_headroom.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "glyph_headroom", module)
    spec.loader.exec_module(module)
    return module


def test_every_headroom_cell_has_its_recipe_and_registration(monkeypatch):
    from training.loss_comparison.preregistration import resolve
    from training.trainer.launch.recipes import recipe_values

    headroom = _headroom(monkeypatch)
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
    }


def _records(family: dict) -> list:
    return [
        {"label": label, "seed": seed, "verdict": "ok", "metrics": {"clone/family_without_mark": value}}
        for label, values in family.items()
        for seed, value in enumerate(values)
    ]


def test_the_bar_needs_clip_at_twice_chance_and_an_oracle_gain_of_five_points_above_zero(monkeypatch):
    headroom = _headroom(monkeypatch)
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


def test_the_loss_comparison_runs_under_the_headroom_registration(monkeypatch, tmp_path):
    headroom = _headroom(monkeypatch)
    bench = sys.modules["glyph_benchmark"]
    monkeypatch.setattr(
        bench,
        "prepare_data",
        lambda root: {
            "seed": 0,
            "splits": {"train": {"data": "train/x.tar", "num_samples": 6144}, "val": {"data": "val/x.tar"}},
            "clone_selection": "cs",
        },
    )
    monkeypatch.setattr(bench, "pretrain", lambda root, manifest: Path("pre.pt"))
    argv = headroom.headroom_argv("finetune-gold-long", "20,21", tmp_path, tmp_path / "results", [])
    assert argv[argv.index("--recipe") + 1] == "glyphs-finetune-gold-long"
    assert argv[argv.index("--losses") + 1] == headroom.CONTROLS
    assert argv[argv.index("--preregistration") + 1] == "docs/preregistration_headroom.md#headroom_finetune_gold_long"
    assert argv[argv.index("--results-md") + 1] == str(tmp_path / "results" / "headroom_finetune_gold_long.md")
    assert argv[argv.index("--train-args") + 1] == "--pretrained pre.pt"

"""AdaCL's default trains the tiny model on clone-dense batches without collapsing (docs/adacl.md), and
its margins adapt: they stay inside their bounds, the bounds bind on fewer than half of the steps,
and the applied m1 / logit_scale and m2 move from step to step. (Literal mode's collapse is measured
by the loss comparison, over seeds, in docs/RESULTS.md.)"""

import math
import statistics

import pytest

from open_clip_adacl import get_loss_class
from training import RunDir
from training.main import main

BATCH = 64
STEPS = 96  # 12 epochs of the fixture's 512 training scenes, in families of 8 kept whole per batch
DEFAULTS = {option.name: option.default for option in get_loss_class("adacl").Options.specs()}


def _train(demo_shards, logs, name, *loss_flags):
    main(
        [
            "--train-data",
            str(demo_shards / "train" / "shard-{000000..000003}.tar"),
            "--val-data",
            str(demo_shards / "val" / "shard-000000.tar"),
            "--val-frequency",
            "12",
            "--model",
            "adacl-tiny",
            "--batch-size",
            str(BATCH),
            "--epochs",
            str(STEPS * BATCH // 512),
            "--train-group-size",
            "8",
            "--lr",
            "2e-3",
            "--warmup",
            "10",
            "--wd",
            "0.1",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--save-frequency",
            "0",
            "--logs",
            str(logs),
            "--name",
            name,
            "--log-every-n-steps",
            "1",
            *loss_flags,
        ]
    )
    run = RunDir(logs / name)
    train = run.metrics("train")
    assert len(train) == STEPS
    final_loss = sum(r["loss"] for r in train[-10:]) / 10
    val = run.metrics("val")[-1]
    return final_loss, val, train


@pytest.mark.slow  # 96 steps with validation: about 30 s on 2 cores
def test_default_adacl_adapts_on_clone_dense_batches_without_collapsing(demo_shards, tmp_path):
    final_loss, val, train = _train(demo_shards, tmp_path, "adacl-default", "--loss", "adacl")
    assert final_loss < 0.8 * math.log(BATCH), final_loss
    chance_recall = 1 / 128
    assert val["val/image_to_text_R@1"] > 3 * chance_recall and val["val/text_to_image_R@1"] > 3 * chance_recall
    # The console line carries the headline margins, the directions said once; every stat reaches metrics.jsonl.
    out_log = (tmp_path / "adacl-default" / "out.log").read_text()
    assert "| i2t/t2i m2: " in out_log and " anchor: " in out_log
    assert "stats/i2t/fallback_few_rows" in train[-1]
    for direction in ("i2t", "t2i"):
        modulated = [r[f"stats/{direction}/modulated"] for r in train]
        # Applied on most steps (the `upper` region finds no candidate on some early ones), and every
        # fallback is counted, not silent.
        assert sum(modulated) > 0.75 * STEPS
        assert train[-1][f"stats/{direction}/fallbacks"] == STEPS - sum(modulated)
        # The margins are recorded at the modulated steps only (a fallback step chose none).
        applied = [r for r in train if r[f"stats/{direction}/modulated"] == 1]
        assert not any(f"stats/{direction}/m2" in r for r in train if r not in applied)
        ratio = [r[f"stats/{direction}/m1_over_scale"] for r in applied]
        offset = [r[f"stats/{direction}/m2"] for r in applied]
        assert all(1.0 <= value <= DEFAULTS["max_scale_ratio"] + 1e-9 for value in ratio)
        assert all(0.0 <= value <= DEFAULTS["max_offset"] + 1e-9 for value in offset)
        # Adapts: the bounds decide fewer than half of the steps, and the margins move with the batch.
        for bound in ("scale_bounded", "offset_bounded", "anchor_clamped"):
            assert statistics.fmean(r[f"stats/{direction}/{bound}"] for r in applied) < 0.5, (direction, bound)
        assert statistics.pstdev(ratio[10:]) > 0.01 and statistics.pstdev(offset[10:]) > 0.005, direction

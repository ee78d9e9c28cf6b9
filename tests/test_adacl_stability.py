"""AdaCL's default mode trains the tiny model without collapsing (docs/method.md §4b), with its margins
applied and inside their bounds. (Literal mode's collapse is measured by the benchmark, over seeds,
in docs/RESULTS.md.)"""
import math

from training.logger import read_metrics
from training.main import main

BATCH = 64
STEPS = 200  # 25 epochs of the fixture's 512 training scenes


def _train(demo_shards, logs, name, *loss_flags):
    main(["--train-data", str(demo_shards / "train" / "shard-{000000..000003}.tar"),
          "--val-data", str(demo_shards / "val" / "shard-000000.tar"), "--val-frequency", "25",
          "--model", "adacl-tiny", "--batch-size", str(BATCH), "--epochs", str(STEPS * BATCH // 512),
          "--lr", "2e-3", "--warmup", "20", "--wd", "0.1", "--workers", "0", "--device", "cpu",
          "--save-frequency", "0", "--logs", str(logs), "--name", name, "--log-every-n-steps", "1", *loss_flags])
    metrics = logs / name / "metrics.jsonl"
    train = read_metrics(metrics, "train")
    assert len(train) == STEPS
    final_loss = sum(r["loss"] for r in train[-20:]) / 20
    val = read_metrics(metrics, "val")[-1]
    return final_loss, val, train


def test_default_adacl_does_not_collapse_and_modulates(demo_shards, tmp_path):
    final_loss, val, train = _train(demo_shards, tmp_path, "adacl-default", "--loss", "adacl")
    chance_loss = math.log(BATCH)
    assert final_loss < 0.5 * chance_loss, final_loss
    chance_recall = 1 / 128
    assert val["val/image_to_text_R@1"] > 5 * chance_recall and val["val/text_to_image_R@1"] > 5 * chance_recall
    # The margins were applied (not a silent fallback to vanilla CL) and stayed inside their bounds.
    modulated = [r["stats/i2t/modulated"] for r in train]
    assert sum(modulated) > 0.9 * STEPS
    # The console line carries the headline margins; every stat reaches metrics.jsonl.
    out_log = (tmp_path / "adacl-default" / "out.log").read_text()
    assert "i2t/m1:" in out_log and "t2i/anchor:" in out_log and "fallback_few_rows" not in out_log
    assert "stats/i2t/fallback_few_rows" in train[-1]
    for r in train:
        for d in ("i2t", "t2i"):
            assert 1.0 <= r[f"stats/{d}/m1_over_scale"] <= 1.1 + 1e-9 and 0.0 <= r[f"stats/{d}/m2"] <= 0.1 + 1e-9

"""Dashboards: tensorboard tags (and wandb keys) named as OpenCLIP 3.3.0's trainer names them."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers.run_utils import tiny_argv
from training import RunDir
from training.main import main

# The scalars open_clip_train.train logs (train_one_epoch's log_data and evaluate's metrics).
OPENCLIP_TRAIN_TAGS = {
    "train/loss",
    "train/contrastive_loss",
    "train/scale",
    "train/lr",
    "train/data_time",
    "train/batch_time",
    "train/samples_per_second",
    "train/samples_per_second_per_gpu",
}
OPENCLIP_VAL_TAGS = {
    "val/clip_val_loss",
    "val/num_samples",
    "val/image_to_text_R@1",
    "val/text_to_image_R@10",
    "val/image_to_text_mean_rank",
}


def run_argv(demo_shards, logs, name, *extra):
    return tiny_argv(
        logs,
        name,
        *("--val-data", str(demo_shards / "val" / "shard-000000.tar"), "--loss", "adacl", "--lr", "1e-3"),
        *("--log-every-n-steps", "2", *extra),
        data=demo_shards / "train" / "shard-{000000..000003}.tar",
        samples=128,
        epochs=2,
    )


@pytest.fixture(scope="module")
def tensorboard_scalars(demo_shards, module_tmp):
    logs = module_tmp("dashboards")
    main(run_argv(demo_shards, logs, "tb", "--report-to", "tensorboard"))
    events = EventAccumulator(str(logs / "tb" / "tensorboard"))
    events.Reload()
    scalars = {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return scalars, RunDir(logs / "tb").metrics("train")


@pytest.mark.slow
def test_tensorboard_tags_are_openclips(tensorboard_scalars):
    tensorboard_scalars, train_records = tensorboard_scalars
    tags = set(tensorboard_scalars)
    assert OPENCLIP_TRAIN_TAGS <= tags and OPENCLIP_VAL_TAGS <= tags
    assert not any(tag.startswith(("val/val/", "train/logit_scale", "train/stats")) for tag in tags)
    # At the step's index from 0, as OpenCLIP's `step = num_batches_per_epoch * epoch + i_accum`.
    assert tensorboard_scalars["train/loss"] == [(r["step"] - 1, pytest.approx(r["loss"])) for r in train_records]
    assert tensorboard_scalars["train/scale"] == [
        (r["step"] - 1, pytest.approx(r["logit_scale"])) for r in train_records
    ]
    assert tensorboard_scalars["train/contrastive_loss"] == tensorboard_scalars["train/loss"]
    assert tensorboard_scalars["train/loss"][0][0] == 0
    assert [step for step, _ in tensorboard_scalars["val/clip_val_loss"]] == [1, 2]  # at the epoch, as OpenCLIP


@pytest.mark.slow
def test_loss_stats_and_epoch_summaries_have_their_own_prefixes(tensorboard_scalars):
    tags = set(tensorboard_scalars[0])
    assert {"loss_stats/i2t/m1", "loss_stats/t2i/anchor"} <= tags
    assert {"epoch/loss", "epoch/skipped/bad_image"} <= tags
    assert {tag.split("/")[0] for tag in tags} == {"train", "val", "loss_stats", "epoch"}


@pytest.mark.slow
def test_wandb_runs_offline_with_the_same_keys(demo_shards, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is the optional [wandb] extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    main(
        run_argv(
            demo_shards,
            tmp_path,
            "wb",
            "--report-to",
            "tensorboard,wandb",
            "--wandb-project-name",
            "adacl-test",
            "--wandb-notes",
            "offline test",
            "--epochs",
            "1",
        )
    )
    # run.finish() returns before wandb's service has written the run file (it did so 60 ms later under load);
    # teardown waits for the service, as the atexit hook does when the trainer's process ends.
    wandb.teardown()
    [run_file] = (tmp_path / "wb" / "wandb").glob("offline-run-*-wb/run-wb.wandb")  # the run's name is its id
    # wandb 0.31 has no Python reader for its record log; history keys are stored as plain protobuf strings.
    records = run_file.read_bytes()
    for key in (
        "train/loss",
        "train/scale",
        "val/clip_val_loss",
        "loss_stats/i2t/m1",
        "epoch/loss",
        "adacl-test",
        "offline test",
    ):
        assert key.encode() in records, key
    assert b"train/logit_scale" not in records and b"val/val/" not in records
    assert list((tmp_path / "wb" / "tensorboard").iterdir())  # both dashboards at once

"""Checkpoints hold the run's stateful components by name; a checkpoint of the earlier layout (a real one,
tests/training/fixtures/legacy_checkpoint/, written by the trainer before the change) is converted on load, and
resumes and exports as the run that wrote it would have gone on."""

import logging
from pathlib import Path

import open_clip
import pytest
import torch

from helpers.run_utils import losses_by_step
from training import RunDir
from training.export import export
from training.main import main
from training.trainer.data import DataPosition, Skipped
from training.trainer.distributed import DistributedEnv
from training.trainer.engine.checkpoint import CheckpointConfig, Checkpointer, EpochSums, TrainState, run_components
from training.trainer.launch.resume import resume
from training.trainer.run_folder.checkpoint_files import CHECKPOINT_FORMAT, load_checkpoint

FIXTURE = Path(__file__).parents[2] / "fixtures" / "legacy_checkpoint"
LEGACY_CHECKPOINT = FIXTURE / "step_3.pt"


@pytest.fixture(scope="module")
def fixture_model():
    """The fixture's test-only model config, registered with open_clip as the run that wrote it did."""
    open_clip.add_model_config(FIXTURE / "fixture-tiny.json")
    return "fixture-tiny"


def test_the_run_state_round_trips_through_its_state_dicts():
    state = TrainState(
        position=DataPosition(epoch=2, batches_in_epoch=5),
        step=21,
        num_nonfinite_steps=1,
        consecutive_nonfinite_steps=1,
        samples_seen=672,
        samples_per_schedule_step=32,
    )
    cut = {"/data/cut.tar": {"bad_tar": 2}, "pipe:false": {"unreadable_shard": 1}}
    state.epoch_sums.load_state_dict(
        {"skip_counts": torch.tensor([1, 0, 2]), "loss_sum": 3.5, "num_loss_steps": 5, "shard_visits": cut}
    )
    restored = TrainState()
    for original, copy in [
        (state, restored),
        (state.position, restored.position),
        (state.epoch_sums, restored.epoch_sums),
    ]:
        copy.load_state_dict(original.state_dict())
    assert restored.state_dict() == state.state_dict() and restored.position == state.position
    assert torch.equal(restored.epoch_sums.skip_counts, state.epoch_sums.skip_counts)
    assert (restored.epoch_sums.loss_sum, restored.epoch_sums.num_loss_steps) == (3.5, 5)
    assert restored.epoch_sums.shard_visits == cut


def test_epoch_sums_are_plain_data_that_a_weights_only_load_reads(tmp_path):
    """The named shards are saved as plain dicts: checkpoints load with weights_only=True."""
    sums = EpochSums()
    sums.reset(2)
    sums.add_skipped(Skipped(torch.tensor([1, 0]), {"/data/cut.tar": {"bad_tar": 1}}))
    torch.save({"epoch_sums": [sums.state_dict()]}, tmp_path / "sums.pt")
    [loaded] = torch.load(tmp_path / "sums.pt", weights_only=True)["epoch_sums"]
    assert loaded["shard_visits"] == {"/data/cut.tar": {"bad_tar": 1}} and type(loaded["shard_visits"]) is dict


def test_epoch_sums_of_another_world_size_merge_for_rank_0():
    states = [
        {"skip_counts": torch.tensor([1, 2]), "loss_sum": 4.0, "num_loss_steps": 2},  # before shards were named
        {"skip_counts": torch.tensor([0, 5]), "loss_sum": 4.5, "num_loss_steps": 2, "shard_visits": {"a": {"x": 5}}},
    ]
    merged = EpochSums.merge_rank_states(states)
    assert torch.equal(merged["skip_counts"], torch.tensor([1, 7])) and merged["loss_sum"] == 4.0
    assert merged["shard_visits"] == {"a": {"x": 5}}


def test_a_checkpoint_in_the_earlier_layout_is_converted_on_load(caplog):
    raw = torch.load(LEGACY_CHECKPOINT, map_location="cpu", weights_only=True)
    assert "format" not in raw and "train" not in raw  # really the earlier layout
    with caplog.at_level(logging.INFO):
        converted = load_checkpoint(LEGACY_CHECKPOINT)
    [message] = [record.getMessage() for record in caplog.records if "converted on load" in record.getMessage()]
    assert "earlier checkpoint layout" in message and "\n" not in message
    old = raw["data"]
    assert converted["format"] == CHECKPOINT_FORMAT
    assert (
        converted["data"]
        == {"epoch": old["epoch"], "batches_in_epoch": old["batches_in_epoch"]}
        == {"epoch": 0, "batches_in_epoch": 3}
    )
    assert converted["train"] == {
        "step": raw["step"],
        "num_nonfinite_steps": old["num_nonfinite_steps"],
        "consecutive_nonfinite_steps": 0,
        "samples_seen": old["samples_seen"],
        "samples_per_schedule_step": old["samples_per_schedule_step"],
    }
    [sums] = converted["epoch_sums"]  # written by one rank
    assert torch.equal(sums["skip_counts"], old["skip_counts"])
    assert (sums["loss_sum"], sums["num_loss_steps"]) == (old["loss_sum"], old["num_loss_steps"])
    assert old["loss_sum"] > 0
    for key in ("epoch", "step", "name", "args", "model_cfg", "preprocess_cfg", "world_size"):
        assert converted[key] == raw[key], key
    assert torch.equal(converted["rng"][0]["torch"], raw["rng"][0]["torch"])
    for key, value in raw["state_dict"].items():
        assert torch.equal(converted["state_dict"][key], value), key
    for key, value in raw["loss"].items():
        assert torch.equal(converted["loss"][key], value), key
    assert converted["optimizer"]["state"].keys() == raw["optimizer"]["state"].keys()


@pytest.mark.slow
def test_a_run_resumed_from_the_earlier_layout_goes_on_as_the_run_that_wrote_it(fixture_model, tmp_path):
    """The fixture's run trained 16 steps; resumed from its step 3 in the earlier layout, the steps 4..16
    and both epoch summaries (epoch 0's counts the 3 steps before the checkpoint) are the ones it logged."""
    summary = main(
        [
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "64",
            "--batch-size",
            "8",
            "--epochs",
            "2",
            "--model",
            fixture_model,
            "--loss",
            "adacl",
            "--adacl-queue-size",
            "16",
            "--lock-text",
            "--lock-text-unlocked-layers",
            "2",
            "--lr",
            "1e-3",
            "--warmup",
            "2",
            "--save-every-n-steps",
            "3",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--log-every-n-steps",
            "1",
            "--logs",
            str(tmp_path),
            "--name",
            "resumed",
            "--resume",
            str(LEGACY_CHECKPOINT),
        ]
    )
    assert (summary.epoch, summary.step) == (2, 16)
    log = (tmp_path / "resumed" / "out.log").read_text()
    assert "converted on load" in log and "Resumed from" in log and "3 batches into the epoch" in log
    expected, resumed = losses_by_step(FIXTURE), losses_by_step(tmp_path / "resumed")
    assert sorted(resumed) == list(range(4, 17))
    for step, loss in resumed.items():
        assert loss == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step
    for theirs, ours in zip(
        RunDir(FIXTURE).metrics("epoch"), RunDir(tmp_path / "resumed").metrics("epoch"), strict=True
    ):
        assert (ours["epoch"], ours["num_steps"]) == (theirs["epoch"], theirs["num_steps"])
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    # The checkpoints it writes are in today's layout.
    assert load_checkpoint(tmp_path / "resumed" / "checkpoints" / "epoch_2.pt")["format"] == CHECKPOINT_FORMAT


def test_a_checkpoint_in_the_earlier_layout_exports_to_stock_open_clip(tmp_path):
    output = export(LEGACY_CHECKPOINT, tmp_path / "export")
    loaded = open_clip.create_model(f"local-dir:{output}").state_dict()
    raw = torch.load(LEGACY_CHECKPOINT, map_location="cpu", weights_only=True)["state_dict"]
    assert loaded.keys() == raw.keys()
    for key, value in raw.items():
        assert torch.equal(loaded[key], value), key


def test_per_rank_components_of_another_world_size(tmp_path, caplog):
    """Saved by 2 ranks, resumed on 1: the RNG streams start afresh (with a warning), the epoch sums
    merge into rank 0 (skip counts summed), every other component loads as saved."""

    def components(state):
        model = torch.nn.Linear(2, 2)
        return run_components(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            scaler=None,
            loss=torch.nn.Module(),
            state=state,
        )

    saved_state = TrainState(position=DataPosition(epoch=1, batches_in_epoch=4), step=12)
    saved_state.epoch_sums.load_state_dict({"skip_counts": torch.tensor([2, 0]), "loss_sum": 6.0, "num_loss_steps": 4})
    checkpointer = Checkpointer(
        CheckpointConfig(),
        checkpoint_dir=str(tmp_path),
        components=components(saved_state),
        env=DistributedEnv(),
        name="n",
        args={},
        model_cfg={},
        preprocess_cfg={},
    )
    checkpoint = checkpointer.payload()
    other_rank = {"skip_counts": torch.tensor([1, 3]), "loss_sum": 6.0, "num_loss_steps": 4}
    checkpoint.update(world_size=2, rng=checkpoint["rng"] * 2, epoch_sums=checkpoint["epoch_sums"] + [other_rank])

    state = TrainState()
    with caplog.at_level(logging.INFO):
        resume("step_12.pt", components(state), env=DistributedEnv(), checkpoint=checkpoint)
    assert "step_12.pt holds rng states of 2 ranks, this run has 1; rng starts afresh on every rank" in caplog.text
    assert state.rng.pending is None
    assert torch.equal(state.epoch_sums.skip_counts, torch.tensor([3, 3])) and state.epoch_sums.loss_sum == 6.0
    assert (state.position, state.step) == (DataPosition(epoch=1, batches_in_epoch=4), 12)

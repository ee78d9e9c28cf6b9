"""Every loss state that changes training is in the checkpoint: for each stateful loss and clone discovery, a run
resumed mid-epoch from a step checkpoint (rolled back into a new run folder) trains as the uninterrupted run, bit
for bit, and ends with its state; resumed with --reset-loss-state it does not (so the state mattered)."""

import pytest
import torch

from helpers.run_utils import assert_same_final_state, losses_by_step, tiny_argv
from training.main import main
from training.trainer.run_folder.checkpoint_files import load_checkpoint

# Each stateful configuration, with the options under which its state moves from the first epoch on.
STATEFUL = {
    "adacl-queue": ["--loss", "adacl", "--adacl-queue-size", "40"],
    "adacl-bank": ["--loss", "adacl", "--adacl-bank-size", "48", "--data-size", "512"],
    "fne": ["--loss", "fne", "--fne-start-epoch", "0", "--fne-min-matched", "1"],
    "glofnd": ["--loss", "glofnd", "--data-size", "512"],
    "adaclw-persistence": ["--loss", "adaclw", "--adaclw-discovery", "persistence"],
    "adaclw-persistence_text_image_tokens": [
        "--loss",
        "adaclw",
        "--adaclw-discovery",
        "persistence_text_image_tokens",
    ],
    "adaclw-random": ["--loss", "adaclw", "--adaclw-discovery", "random", "--adaclw-quota", "0.08"],
}
# The new state (the persistence memory) runs in the default suite; the others, whose resume tests came first
# (test_resume.py, the losses' own state_dict tests), in the slow tests (scripts/test.sh --slow-only).
DEFAULT_SUITE = {"adaclw-persistence"}
# GloFND's thresholds move one Adam step per sample and epoch: in these 2 epochs they mask no negative yet, so its
# restored state cannot act on the losses here (tests/open_clip_adacl/losses/test_glofnd.py shows it acting).
STATE_ACTS_WITHIN_THE_RUN = set(STATEFUL) - {"glofnd"}
RESUME_FROM = 6  # 2 batches into epoch 1 (4 steps an epoch)


def argv(demo_shards, logs, name, loss_flags, *extra):
    """2 epochs of 4 steps (batch 32 of 128 samples, so pairs of samples meet again), step_N.pt every 3 steps."""
    return tiny_argv(
        logs,
        name,
        *(*loss_flags, "--lr", "2e-3", "--log-every-n-steps", "1", "--save-every-n-steps", "3"),
        *("--keep-step-checkpoints", "0", *extra),
        data=demo_shards / "train" / "shard-{000000..000003}.tar",
        samples=128,
        epochs=2,
        warmup=2,
    )


@pytest.mark.parametrize(
    "case", [case if case in DEFAULT_SUITE else pytest.param(case, marks=pytest.mark.slow) for case in STATEFUL]
)
def test_a_stateful_loss_resumed_mid_epoch_trains_bit_for_bit_as_the_uninterrupted_run(demo_shards, tmp_path, case):
    flags = STATEFUL[case]
    main(argv(demo_shards, tmp_path, "reference", flags))
    saved = tmp_path / "reference" / "checkpoints" / f"step_{RESUME_FROM}.pt"
    state = load_checkpoint(saved)["loss"]
    assert state and any(value.numel() and value.any() for value in state.values())  # a state that moved
    resumed = main(argv(demo_shards, tmp_path, "resumed", flags, "--resume", str(saved)))
    assert resumed.step == 8
    expected, got = losses_by_step(tmp_path / "reference"), losses_by_step(tmp_path / "resumed")
    assert sorted(got) == [7, 8]
    assert all(got[step] == expected[step] for step in got), (got, expected)  # bit for bit
    assert_same_final_state(tmp_path / "resumed", tmp_path / "reference")  # the loss state with torch.equal
    if case in STATE_ACTS_WITHIN_THE_RUN:
        main(argv(demo_shards, tmp_path, "reset", flags, "--resume", str(saved), "--reset-loss-state"))
        reset = losses_by_step(tmp_path / "reset")
        assert any(reset[step] != expected[step] for step in reset)  # without the state, training differs


def test_the_persistence_memory_is_in_the_checkpoint_and_grows_with_the_pairs_met(demo_shards, tmp_path):
    main(argv(demo_shards, tmp_path, "run", STATEFUL["adaclw-persistence"], "--epochs", "1"))
    early = load_checkpoint(tmp_path / "run" / "checkpoints" / "step_3.pt")["loss"]
    final = load_checkpoint(tmp_path / "run" / "checkpoints" / "epoch_1.pt")["loss"]
    assert set(final) == {"memory.keys", "memory.averages"}
    assert 3 * 32 * 31 >= early["memory.keys"].numel() > 0  # at most the ordered pairs of 3 batches
    assert final["memory.keys"].numel() > early["memory.keys"].numel()
    assert torch.equal(final["memory.keys"], final["memory.keys"].sort().values)  # sorted, as the memory keeps them

"""A new loss is one module: this file declares one, registers it and trains it through
`training.main`, with no edit anywhere else. Its options become flags and loss-comparison variants,
reach params.txt and are validated; its state is checkpointed and moves once per optimizer step."""

from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from helpers.registries import scratch_entries
from helpers.run_utils import tiny_argv
from open_clip_adacl import DistributedSetup, LossOptions, option, register_loss
from open_clip_adacl.losses import ContrastiveLoss, GlobalBatch, registry
from studies.comparison.variants import parse_loss_variant
from training import ConfigError, RunDir
from training.main import main
from training.trainer.launch.params import build_parser
from training.trainer.run_folder.checkpoint_files import load_checkpoint

NAME = "tempered"


class TemperedClip(ContrastiveLoss):
    """InfoNCE on logits divided by a temper, counting the optimizer steps it trained."""

    @dataclass(frozen=True)
    class Options(LossOptions):
        temper: float = option(1.0, "divides every logit before the cross-entropy")

        def check(self) -> None:
            if self.temper <= 0:
                raise ValueError(f"temper must be > 0, got {self.temper}")

    keeps_state = True

    def __init__(self, options: Optional[Options] = None, dist: DistributedSetup = DistributedSetup()):
        super().__init__(options, dist)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def adjust_logits(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        if self.training and direction == "i2t":
            self.stage_update(lambda: self.steps.add_(1))
        return batch.logits(direction) / self.options.temper


@pytest.fixture
def registered(monkeypatch):
    """The loss registered with the real decorator, in a copy of the registry this test throws away."""
    scratch_entries(monkeypatch, registry.LOSSES)
    register_loss(NAME)(TemperedClip)


def _argv(logs, *extra):
    return tiny_argv(
        logs,
        "tempered",
        *("--dataset-type", "synthetic", "--accum-freq", "2", "--lr", "1e-3", "--loss", NAME, *extra),
        samples=32,
        batch_size=8,
    )


def test_a_loss_declared_in_one_file_trains_through_the_trainer(registered, tmp_path):
    assert "--tempered-temper" in build_parser().format_help()
    summary = main(_argv(tmp_path, "--tempered-temper", "2"))
    run = tmp_path / "tempered"
    assert "tempered_temper: 2.0" in (run / "params.txt").read_text()
    steps = RunDir(run).metrics("train")
    assert summary.step == len(steps) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in steps)
    # Two micro-batches per step, one state move per optimizer step; the checkpoint holds the state.
    assert load_checkpoint(summary.checkpoint)["loss"]["steps"].item() == 2


def test_the_loss_comparison_takes_it_as_a_variant(registered):
    variant = parse_loss_variant("tempered:temper=2")
    assert variant.values(data_size=64) == {"loss": NAME, "tempered_temper": 2.0}
    with pytest.raises(ValueError, match="temper must be > 0"):
        parse_loss_variant("tempered:temper=0")


def test_its_options_are_validated_and_its_flags_belong_to_it(registered, tmp_path):
    with pytest.raises(ConfigError, match="--loss tempered: --tempered-temper must be > 0, got -1.0"):
        main(_argv(tmp_path, "--tempered-temper", "-1", "--dry-run"))
    with pytest.raises(ConfigError, match="--tempered-temper is an option of --loss tempered, but --loss is 'clip'"):
        main(_argv(tmp_path, "--tempered-temper", "2", "--dry-run") + ["--loss", "clip"])

"""A study's common pretraining is reused only under the identity it recorded (recipe, seed, data seed, code)."""

import json

import pytest

from studies import clone_study, glyph_benchmark, pretraining
from training import RunDir
from training.trainer.launch.recipes import recipe_values


class WrittenData:
    """Data already written (its manifest's data seed), so that the test writes no shards."""

    def __init__(self, seed: int):
        self.seed = seed

    def training(self, root):
        from studies.data import TrainingData

        return TrainingData("train-{0..1}.tar", "val.tar", 64, self.seed)


@pytest.mark.parametrize("study", [glyph_benchmark, clone_study])
def test_a_study_does_not_reuse_a_pretraining_that_recorded_no_identity(tmp_path, study):
    """A finished pretraining folder from before identities were recorded (its final checkpoint there) is
    refused, not fine-tuned from: what it trained on cannot be checked."""
    common = glyph_benchmark.PRETRAINING if study is glyph_benchmark else clone_study.CELLS["transfer"].pretraining
    common = type(common)(common.name, common.recipe, common.seed, WrittenData(common.data.seed))
    run = tmp_path / "pretrain" / common.name
    checkpoint = RunDir(run).epoch_checkpoint(recipe_values(common.recipe, world_size=1)["epochs"])
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights of unknown origin")
    with pytest.raises(SystemExit, match=rf"error: {run} records no identity.json .*; remove it to train again"):
        pretraining.pretrain(common, tmp_path)


def test_a_pretraining_of_the_same_identity_is_reused_and_another_is_refused(tmp_path):
    common = glyph_benchmark.PRETRAINING
    common = type(common)(common.name, common.recipe, common.seed, WrittenData(0))
    run = tmp_path / "pretrain" / common.name
    pretraining.check_or_record_identity(run, pretraining.training_identity(common.recipe, common.seed, 0))
    checkpoint = RunDir(run).epoch_checkpoint(recipe_values(common.recipe, world_size=1)["epochs"])
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")
    assert pretraining.pretrain(common, tmp_path) == checkpoint  # the same recipe, seed, data seed and code
    recorded = json.loads((run / "identity.json").read_text())
    (run / "identity.json").write_text(json.dumps({**recorded, "seed": 1001}))
    with pytest.raises(SystemExit, match="seed 1001 there, 1000 here"):
        pretraining.pretrain(common, tmp_path)

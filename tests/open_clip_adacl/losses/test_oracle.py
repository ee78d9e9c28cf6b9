"""oracle: negatives from the query's own family count `weight` times in the denominator (a control)."""

import pytest
import torch

from helpers.loss_equivalence import assert_ranks_match_single_process, make_batches, value_and_grads
from open_clip_adacl import create_loss
from training import RunDir
from training.main import main
from training.synthetic_scenes.families import measure_siblings
from training.trainer.data import DataConfig


def _with_families(batches):
    """Families of four consecutive sample ids; ids divisible by 5 have none (-1)."""
    return [(x, y, index, torch.where(index % 5 == 0, -1, index // 4)) for x, y, index in batches]


def _dense_oracle(weight, family):
    def loss(x, y, scale, sample_index):
        same = (family[:, None] == family[None, :]) & (family[:, None] >= 0) & ~torch.eye(len(family), dtype=torch.bool)
        multiplicity = torch.where(same, weight, 1.0).to(x.dtype)
        total = 0
        image_logits = scale * x @ y.T  # one matmul for both directions, as the loss computes them
        for logits in (image_logits, image_logits.T):
            positive = logits.diagonal()
            total = total + ((multiplicity * logits.exp()).sum(dim=1).log() - positive).mean()
        return total / 2

    return loss


@pytest.mark.parametrize("weight", [4.0, 0.0])
def test_matches_dense_formula_and_counts_family_negatives(weight):
    x, y, index, family = _with_families(make_batches(1, 16, 8, data_size=24, seed=1))[0]
    x, y = x.double(), y.double()
    loss_fn = create_loss("oracle", weight=weight)
    ours = value_and_grads(loss_fn, x, y, index, family=family)
    for a, b in zip(ours, value_and_grads(_dense_oracle(weight, family), x, y, index)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    same = (family[:, None] == family[None, :]) & (family[:, None] >= 0)
    expected = (same.sum() - (family >= 0).sum()) / len(family)
    assert expected > 0 and loss_fn.stats["family_negatives"].item() == pytest.approx(expected.item())
    if weight == 0:
        assert loss_fn.stats["i2t/family_prob"] == 0
    else:
        assert loss_fn.stats["i2t/family_prob"] > 0 and loss_fn.stats["t2i/family_prob"] > 0


def test_weight_one_is_exactly_clip():
    x, y, index, family = _with_families(make_batches(1, 16, 8, data_size=24, seed=2))[0]
    ours = value_and_grads(create_loss("oracle", weight=1.0), x, y, index, family=family)
    for a, b in zip(ours, value_and_grads(create_loss("clip", shared_matmul=True), x, y, index)):
        assert torch.equal(a, b)


def test_missing_family_ids_are_a_clear_error():
    x, y, index = make_batches(1, 8, 8, data_size=8)[0]
    with pytest.raises(ValueError, match="oracle loss needs each sample's family id"):
        create_loss("oracle")(x, y, torch.tensor(10.0), sample_index=index)
    with pytest.raises(ValueError, match="weight must be >= 0"):
        create_loss("oracle", weight=-1.0)


def test_group_ids_make_a_clone_of_every_negative_sharing_one_id_in_its_own_place():
    """Group ids, one per kind of sibling (the glyph benchmark's one-edit relation): a base shares each kind's
    group with that kind's sibling; two siblings of different kinds share none, so they are no clones of each
    other; an id in another place is another kind's, never shared. One id per sample is the case K = 1."""
    groups = torch.tensor([[10, 20, 30], [10, 21, 31], [12, 20, 32], [13, 23, 10], [-1, -1, -1]])
    clones = torch.tensor(
        [[0, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool
    )
    x, y, index = make_batches(1, 5, 8, data_size=5, seed=4)[0]
    x, y = x.double(), y.double()
    loss_fn = create_loss("oracle", weight=4.0)
    ours = value_and_grads(loss_fn, x, y, index, family=groups)
    for a, b in zip(ours, value_and_grads(_dense_pair_oracle(4.0, clones), x, y, index)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert loss_fn.stats["family_negatives"].item() == pytest.approx(4 / 5)
    as_groups = value_and_grads(create_loss("oracle", weight=4.0), x, y, index, family=groups[:, :1])
    as_ids = value_and_grads(create_loss("oracle", weight=4.0), x, y, index, family=groups[:, 0])
    assert all(torch.equal(a, b) for a, b in zip(as_groups, as_ids))


def _dense_pair_oracle(weight, clones):
    """The oracle with its clone pairs given as a matrix."""

    def loss(x, y, scale, sample_index):
        multiplicity = torch.where(clones, weight, 1.0).to(x.dtype)
        image_logits = scale * x @ y.T
        return (
            sum(
                ((multiplicity * logits.exp()).sum(dim=1).log() - logits.diagonal()).mean()
                for logits in (image_logits, image_logits.T)
            )
            / 2
        )

    return loss


def test_two_ranks_match_single_process():
    batches = _with_families(make_batches(2, 8, 8, data_size=16, seed=3))
    assert_ranks_match_single_process("oracle", {"weight": 16.0}, batches)


def test_training_feeds_the_datas_family_ids_to_the_loss(demo_shards, tmp_path):
    """Through `training.main`: the loss sees, per row, exactly the in-batch siblings the data's json
    families give the real batch stream (batches of 12 cut the 8-sample families, so rows differ)."""
    train = str(demo_shards / "train" / "shard-{000000..000003}.tar")
    main(
        [
            "--train-data",
            train,
            "--train-num-samples",
            "96",
            "--train-group-size",
            "8",
            "--batch-size",
            "12",
            "--model",
            "adacl-tiny",
            "--lr",
            "1e-3",
            "--warmup",
            "1",
            "--epochs",
            "1",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--loss",
            "oracle",
            "--oracle-weight",
            "16",
            "--logs",
            str(tmp_path),
            "--name",
            "oracle",
            "--log-every-n-steps",
            "1",
        ]
    )
    steps = RunDir(tmp_path / "oracle").metrics("train")
    logged = [record["stats/family_negatives"] for record in steps]
    measured = measure_siblings(
        DataConfig(train_data=train, train_num_samples=96, batch_size=12, workers=0, group_size=8)
    )
    assert len(logged) == measured.num_batches == 8
    assert 0 < measured.siblings_per_row < 7
    assert sum(logged) / len(logged) == pytest.approx(measured.siblings_per_row, rel=1e-6)
    assert all(record["stats/i2t/family_prob"] > 0 for record in steps)

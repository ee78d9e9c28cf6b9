"""In-batch siblings measured on the real batch stream of the demo's families."""

import pytest
import torch

from training.synthetic_scenes.families import count_siblings, measure_siblings, read_families
from training.trainer.data import DataConfig


def test_count_siblings_on_hand_built_batches():
    families = {0: 10, 1: 10, 2: 11, 3: 12, 4: 10, 5: 12}
    stats = count_siblings([torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 3, 2])], families, group_size=2)
    # batch 1: rows 0 and 1 are siblings (2 of 4 rows have one); batch 2: rows 5 and 3 (2 of 4)
    assert stats.siblings_per_row == pytest.approx(4 / 8) and stats.sibling_fraction == pytest.approx(0.5 / 3)
    assert (stats.batch_size, stats.group_size, stats.num_batches) == (4, 2, 2)


def test_grouping_puts_whole_families_in_each_batch(demo_shards):
    train = str(demo_shards / "train/shard-{000000..000003}.tar")
    grouped = measure_siblings(DataConfig(train_data=train, batch_size=32, workers=0, group_size=8))
    assert grouped.num_batches == 16 and grouped.siblings_per_row == 7.0  # every row: its 7 siblings
    assert grouped.sibling_fraction == pytest.approx(7 / 31)
    scattered = measure_siblings(DataConfig(train_data=train, batch_size=32, workers=0), epochs=2)
    assert scattered.num_batches == 32 and 0 < scattered.siblings_per_row < 3


def test_shards_without_family_ids_are_named(demo_shards):
    with pytest.raises(ValueError, match="000000000 of .*shard-000000.tar has no 'lineage' in its json"):
        read_families(str(demo_shards / "train/shard-000000.tar"), family_field="lineage")

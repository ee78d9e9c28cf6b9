"""The comparison's demo data: reused while its manifest matches the budget, never written over other files."""

from dataclasses import replace

import pytest

from helpers.comparison_outcomes import TINY
from studies.comparison.data import prepare_data


def test_data_is_reused_when_it_matches_and_never_overwritten(demo_shards, tmp_path):
    data = prepare_data(demo_shards, TINY, data_seed=0)
    assert data.num_train == 512 and data.data_size == 512 and data.train_data.endswith("shard-{000000..000003}.tar")
    with pytest.raises(ValueError, match="holds other demo data"):
        prepare_data(demo_shards, replace(TINY, num_train=1024), data_seed=0)
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "file.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no demo data manifest"):
        prepare_data(tmp_path / "stuff", TINY, data_seed=0)

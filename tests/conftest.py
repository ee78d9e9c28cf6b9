"""Shared fixtures: the demo dataset, generated once per test session."""
import pytest

from training.synthetic_scenes.writers import write_demo_dataset

DEMO_SIZES = {"num_train": 512, "num_val": 128, "num_test": 128, "shard_size": 128}


@pytest.fixture(scope="session")
def demo_shards(tmp_path_factory):
    """Root Path of a small demo dataset (seed 0, 32 px; `training.synthetic_scenes.writers` documents the layout):

    train/shard-{000000..000003}.tar   512 samples, keys 0..511 (json "key" "000000000"...)
    val/shard-000000.tar               128 samples, keys 512..639
    test/shard-000000.tar              128 samples, keys 640..767
    <split>/sizes.json                 {"shard-000000.tar": 128, ...}
      each sample: <key>.png, <key>.txt, <key>.txt_alt, <key>.json {"key", "caption", "scene", ...}
    benchmark/scenes_shape, benchmark/scenes_color   clip-benchmark wds classification (128 images)
    benchmark/scenes_retrieval                       clip-benchmark wds retrieval (the test images)
    clone_selection/shard-000000.tar   the test images: <key>.png + <key>.json
                                       {"key", "caption", "clones": {color, shape, size, relation}}
    manifest.json                      counts, shard patterns, generator settings
    """
    root = tmp_path_factory.mktemp("demo")
    write_demo_dataset(root, seed=0, **DEMO_SIZES)
    return root

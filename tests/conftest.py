"""Shared fixtures: the demo dataset, generated once per test session, and folders for a module's shared runs."""

import shutil

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


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request):
    """`module_tmp("base")` makes a folder for runs that a module's tests share; the folders are deleted once the
    module is done unless one of its tests failed. A tiny model's checkpoint is ~40 MB and a module's runs keep
    dozens, so leaving them to the end of the session (as `tmp_path_factory` does) fills a small disk."""
    made = []

    def make(name):
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    failed_before = request.session.testsfailed
    yield make
    if request.session.testsfailed == failed_before:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)

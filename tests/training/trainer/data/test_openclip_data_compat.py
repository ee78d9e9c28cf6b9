"""One environment for both trainers: open_clip_train's webdataset pipeline and ours read the same shards
with the installed webdataset (a version open_clip_torch[training] accepts, <= 0.2.86)."""

import importlib.metadata

import open_clip
import torch
from open_clip_train.data import get_wds_dataset
from open_clip_train.params import parse_args as openclip_parse_args
from packaging.version import Version

import open_clip_adacl  # noqa: F401  (registers adacl-tiny)
from training.trainer.data import DataConfig, build_train_data, build_val_data


def test_installed_webdataset_is_one_open_clip_train_accepts():
    assert Version(importlib.metadata.version("webdataset")) <= Version("0.2.86")


def test_open_clip_train_and_ours_yield_the_same_first_batch_from_the_same_shards(demo_shards):
    _, preprocess_train, preprocess_val = open_clip.create_model_and_transforms("adacl-tiny")
    tokenizer = open_clip.get_tokenizer("adacl-tiny")
    train, val = (
        str(demo_shards / "train" / "shard-{000000..000003}.tar"),
        str(demo_shards / "val" / "shard-000000.tar"),
    )
    args = openclip_parse_args(
        [
            "--train-data",
            train,
            "--val-data",
            val,
            "--train-num-samples",
            "512",
            "--val-num-samples",
            "128",
            "--batch-size",
            "16",
            "--workers",
            "0",
        ]
    )
    args.world_size = 1
    cfg = DataConfig(train_data=train, val_data=val, train_num_samples=512, batch_size=16, workers=0)

    # Validation reads the shard in order in both, so the batches are identical.
    theirs = next(iter(get_wds_dataset(args, preprocess_val, is_train=False, tokenizer=tokenizer).dataloader))
    ours = next(iter(build_val_data(cfg, preprocess_val, tokenizer).dataloader))
    assert torch.equal(theirs[0], ours[0]) and torch.equal(theirs[1], ours[1])

    # Training shuffles differently (seeded per rank and reader in ours); both yield full batches.
    theirs = next(iter(get_wds_dataset(args, preprocess_train, is_train=True, tokenizer=tokenizer).dataloader))
    ours = next(iter(build_train_data(cfg, preprocess_train, tokenizer).dataloader))
    assert theirs[0].shape == ours[0].shape == (16, 3, 32, 32) and theirs[1].shape == ours[1].shape


def test_the_public_shuffle_filter_draws_as_the_buffer_shuffle_the_stream_used_before():
    """The stream shuffles with webdataset's public `shuffle` filter; before, it called the private function that
    filter wraps. Their draws are the same for the same seed, so checkpoints written before the change resume
    at the same samples (a parity check: exact resume is tested in test_data.py and test_checkpoint.py)."""
    import random

    import webdataset
    from webdataset.filters import _shuffle

    for units, initial, seed in ((16, 4, 0), (64, 64, 1), (5, 1, 2)):
        before = list(_shuffle(iter(range(300)), units, initial, random.Random(seed)))
        assert list(webdataset.shuffle(units, initial, rng=random.Random(seed))(iter(range(300)))) == before

"""The training and validation streams: batch format, splitting, sampling, exact resume, errors
(damaged shards: test_shards.py)."""

import json
from collections import Counter
from dataclasses import replace

import open_clip
import pytest
import torch
import webdataset as wds
from torchvision.transforms.functional import to_tensor

import open_clip_adacl  # noqa: F401  (registers adacl-tiny)
from helpers.data_utils import assert_same_batches, byte_tokenizer, config, decode_texts, indices
from training.trainer.data import SKIP_REASONS, DataConfig, DataError, build_train_data, build_val_data


def train_batches(cfg, epoch=0, preprocess=to_tensor, epochs=(None,)):
    """All batches of `epoch` (or of each epoch in `epochs`, set in turn on one loader)."""
    info = build_train_data(cfg, preprocess, byte_tokenizer, epoch=epoch)
    if epochs == (None,):
        return list(info.dataloader)
    runs = []
    for each in epochs:
        info.set_epoch(each)
        runs.append(list(info.dataloader))
    return runs


def split_samples(root, split="train"):
    """key -> json metadata, read straight from the shards."""
    samples = wds.WebDataset(
        str(root / split / "shard-{000000..000003}.tar" if split == "train" else root / split / "shard-000000.tar"),
        shardshuffle=False,
    )
    return {int(json.loads(s["json"])["key"]): json.loads(s["json"]) for s in samples}


def test_batches_have_the_documented_format_with_open_clip_transforms(demo_shards):
    _, preprocess, _ = open_clip.create_model_and_transforms("adacl-tiny")
    tokenizer = open_clip.get_tokenizer("adacl-tiny")
    info = build_train_data(config(demo_shards, batch_size=64), preprocess, tokenizer)
    assert (info.num_batches, info.num_samples) == (8, 512)
    assert (info.dataloader.num_batches, info.dataloader.num_samples) == (8, 512)  # OpenCLIP's attributes
    batches = list(info.dataloader)
    assert len(batches) == 8
    meta = split_samples(demo_shards)
    for images, texts, sample_index, (skip_counts, shard_visits), family in batches:
        assert family is None  # not asked for (DataConfig.family_field)
        assert images.shape == (64, 3, 32, 32) and images.dtype == torch.float32
        assert texts.shape == (64, 24) and texts.dtype == torch.long
        assert sample_index.dtype == torch.long and skip_counts.dtype == torch.long
        assert skip_counts.tolist() == [0] * len(SKIP_REASONS) and shard_visits == {}
        expected = tokenizer([meta[i]["caption"] for i in sample_index.tolist()])
        assert torch.equal(texts, expected)  # the caption of the very sample the index names
    assert sorted(indices(batches)) == sorted(meta)  # sample_index is the json key


def test_one_epoch_splits_over_ranks_and_workers_without_overlap(demo_shards):
    per_rank = [indices(train_batches(config(demo_shards, rank=rank, world_size=2, workers=2))) for rank in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) == 256
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == list(range(512))


def test_order_is_deterministic_by_seed_and_epoch(demo_shards):
    cfg = config(demo_shards)
    first = indices(train_batches(cfg))
    assert first == indices(train_batches(cfg))
    assert first != indices(train_batches(cfg, epoch=1))
    assert first != indices(train_batches(replace(cfg, seed=8)))
    assert sorted(first) == sorted(indices(train_batches(cfg, epoch=1)))


def test_resampled_sources_follow_the_upsampling_factors(demo_shards):
    sources = f"{demo_shards}/train/shard-{{000000..000001}}.tar::{demo_shards}/train/shard-{{000002..000003}}.tar"
    cfg = config(
        demo_shards,
        train_data=sources,
        dataset_resampled=True,
        train_data_upsampling_factors="1::3",
        train_num_samples=2048,
        batch_size=64,
    )
    drawn = indices(train_batches(cfg))
    assert len(drawn) == 2048
    second_source = sum(index >= 256 for index in drawn) / len(drawn)
    assert 0.65 < second_source < 0.85  # 3 / (1 + 3), per shard as in OpenCLIP
    with pytest.raises(ValueError, match="dataset_resampled"):
        build_train_data(replace(cfg, dataset_resampled=False), to_tensor, byte_tokenizer)
    with pytest.raises(ValueError, match="upsampling factors"):
        build_train_data(replace(cfg, train_data_upsampling_factors="1::2::3"), to_tensor, byte_tokenizer)


def test_caption_key_list_samples_one_field_per_sample(demo_shards):
    meta = split_samples(demo_shards)
    cfg = config(demo_shards, caption_key="txt,txt_alt")
    epoch0, epoch1 = train_batches(cfg, epochs=(0, 1))

    def fields(batches):
        chosen = {}
        for batch in batches:
            for index, text in zip(batch[2].tolist(), decode_texts(batch[1])):
                options = {"txt": meta[index]["caption"], "txt_alt": meta[index]["caption_alt"]}
                chosen[index] = next(field for field, option in options.items() if option == text)
        return chosen

    first, second = fields(epoch0), fields(epoch1)
    assert 0.35 < Counter(first.values())["txt_alt"] / len(first) < 0.65
    assert first == fields(train_batches(cfg))  # deterministic
    assert first != second  # re-drawn each epoch
    val = build_val_data(replace(cfg, val_data=str(demo_shards / "val/shard-000000.tar")), to_tensor, byte_tokenizer)
    val_meta = split_samples(demo_shards, "val")
    for batch in val.dataloader:  # validation always reads the first field
        assert decode_texts(batch[1]) == [val_meta[i]["caption"] for i in batch[2].tolist()]


def test_pseudo_caption_training_validates_on_the_gold_caption(demo_shards):
    meta = split_samples(demo_shards)
    cfg = config(
        demo_shards, caption_key="txt_pseudo", val_caption_key="txt", val_data=str(demo_shards / "val/shard-000000.tar")
    )
    for batch in train_batches(cfg):
        for index, text in zip(batch[2].tolist(), decode_texts(batch[1])):
            assert text == meta[index]["caption_pseudo"]
    val_meta = split_samples(demo_shards, "val")
    for batch in build_val_data(cfg, to_tensor, byte_tokenizer).dataloader:
        assert decode_texts(batch[1]) == [val_meta[i]["caption"] for i in batch[2].tolist()]


def test_group_size_keeps_runs_of_consecutive_samples_whole_in_every_batch(demo_shards):
    """The demo's train shards hold families of 8 consecutive keys; batches of 32 get 4 whole families."""
    meta = split_samples(demo_shards)
    for cfg in (config(demo_shards, group_size=8), config(demo_shards, group_size=8, workers=2, world_size=2)):
        order = indices(train_batches(cfg))
        runs = [order[start : start + 8] for start in range(0, len(order), 8)]
        assert all(run == list(range(run[0], run[0] + 8)) and run[0] % 8 == 0 for run in runs)
        assert all(len({meta[index]["family"] for index in run}) == 1 for run in runs)
        assert [run[0] for run in runs] != sorted(run[0] for run in runs)  # the runs are shuffled
        assert len(set(order)) == len(order) == 512 // cfg.world_size
    resampled = indices(train_batches(config(demo_shards, group_size=8, dataset_resampled=True, train_num_samples=256)))
    assert all(
        resampled[start : start + 8] == list(range(resampled[start], resampled[start] + 8))
        for start in range(0, 256, 8)
    )
    ungrouped = indices(train_batches(config(demo_shards)))
    assert any(abs(a - b) > 8 for a, b in zip(ungrouped, ungrouped[1:8]))  # group size 1 scatters them


@pytest.mark.slow
@pytest.mark.parametrize("workers,group_size", [(0, 1), (2, 1), (2, 8)])
def test_skip_batches_resumes_exactly_mid_epoch(demo_shards, workers, group_size):
    augment = open_clip.image_transform(32, is_train=True)  # random crops: augmentation must match too
    cfg = config(demo_shards, workers=workers, batch_size=16, group_size=group_size)  # 32 batches per epoch
    uninterrupted = train_batches(cfg, epoch=1, preprocess=augment, epochs=(1, 2))
    for skip in (1, 5):
        resumed = train_batches(replace(cfg, skip_batches=skip), epoch=1, preprocess=augment, epochs=(1, 2))
        assert_same_batches(resumed[0], uninterrupted[0][skip:])
        assert_same_batches(resumed[1], uninterrupted[1])  # the next epoch is whole again


def test_reading_in_workers_is_deterministic_and_covers_the_same_samples(demo_shards):
    """Worker processes give the same batches run after run, and the same samples as the main process."""
    cfg = config(demo_shards, world_size=2, rank=1)
    assert_same_batches(train_batches(replace(cfg, workers=2)), train_batches(replace(cfg, workers=2)))
    in_main = indices(train_batches(replace(cfg, workers=0)))
    assert sorted(in_main) == sorted(indices(train_batches(replace(cfg, workers=2))))


def test_batches_hold_one_edit_clone_captions(demo_shards):
    """The demo data's purpose: captions in a batch that differ by one attribute or the relation."""
    meta = split_samples(demo_shards)
    with_neighbour = 0
    batches = train_batches(config(demo_shards, batch_size=64))
    for batch in batches:
        scenes = [meta[i]["scene"] for i in batch[2].tolist()]
        with_neighbour += sum(any(_one_edit_apart(a, b) for b in scenes if b is not a) for a in scenes)
    assert with_neighbour / (64 * len(batches)) > 0.2


def _one_edit_apart(a, b):
    opposite = {
        "to the left of": "to the right of",
        "to the right of": "to the left of",
        "above": "below",
        "below": "above",
    }
    specs_a = [(o["size"], o["color"], o["shape"]) for o in a["objects"]]
    specs_b = [(o["size"], o["color"], o["shape"]) for o in b["objects"]]
    if len(specs_a) != len(specs_b):
        return False
    if specs_a == specs_b:
        return b["relation"] == opposite[a["relation"]]
    if a["relation"] != b["relation"]:
        return False
    if specs_b[:2] == specs_a[1::-1] and specs_a[2:] == specs_b[2:]:
        return True
    changed = [sum(x != y for x, y in zip(sa, sb)) for sa, sb in zip(specs_a, specs_b)]
    return sorted(changed) == [0] * (len(changed) - 1) + [1]


def test_synthetic_data_has_the_same_format_and_resumes(demo_shards):
    cfg = DataConfig(dataset_type="synthetic", train_num_samples=100, batch_size=16, workers=0, seed=1)
    info = build_train_data(cfg, to_tensor, byte_tokenizer)
    batches = list(info.dataloader)
    assert info.num_batches == len(batches) == 6
    images, texts, sample_index, (skip_counts, shard_visits), _ = batches[0]
    assert images.shape == (16, 3, 224, 224) and sample_index.dtype == torch.long
    assert skip_counts.shape == (len(SKIP_REASONS),) and shard_visits == {}
    assert_same_batches(
        list(build_train_data(replace(cfg, skip_batches=4), to_tensor, byte_tokenizer).dataloader), batches[4:]
    )


def test_family_ids_ride_along_only_when_asked_for(demo_shards):
    """With family_field set, each batch's `family` holds each row's json family (-1 where data has none)."""
    plain = train_batches(config(demo_shards, train_num_samples=64))
    with_families = train_batches(config(demo_shards, train_num_samples=64, family_field="family"))
    assert all(batch.family is None for batch in plain) and all(batch.family is not None for batch in with_families)
    assert_same_batches(with_families, plain)
    families = {key: meta["family"] for key, meta in split_samples(demo_shards).items()}
    assert all(batch.family.tolist() == [families[key] for key in batch[2].tolist()] for batch in with_families)
    assert len({family for batch in with_families for family in batch.family.tolist()}) > 1
    synthetic = DataConfig(
        dataset_type="synthetic", train_num_samples=32, batch_size=16, workers=0, family_field="family"
    )
    assert all(torch.equal(batch.family, torch.full((16,), -1)) for batch in train_batches(synthetic))


def test_impossible_configurations_are_rejected(demo_shards):
    with pytest.raises(ValueError, match="cannot be split"):
        build_train_data(config(demo_shards, workers=3, world_size=2), to_tensor, byte_tokenizer)
    with pytest.raises(ValueError, match="do not fill one batch"):
        build_train_data(
            config(demo_shards, train_num_samples=40, batch_size=32, world_size=2), to_tensor, byte_tokenizer
        )
    with pytest.raises(ValueError, match="skip_batches"):
        build_train_data(config(demo_shards, skip_batches=16), to_tensor, byte_tokenizer)
    with pytest.raises(ValueError, match="dataset type"):
        build_train_data(config(demo_shards, train_data="data.json"), to_tensor, byte_tokenizer)
    with pytest.raises(ValueError, match=r"group_size \(--train-group-size\) must be >= 1"):
        build_train_data(config(demo_shards, group_size=0), to_tensor, byte_tokenizer)
    with pytest.raises(ValueError, match="synthetic data has none"):
        build_train_data(
            DataConfig(dataset_type="synthetic", train_num_samples=64, group_size=8), to_tensor, byte_tokenizer
        )


def test_reading_in_the_main_process_leaves_the_callers_random_state_alone(demo_shards):
    augment = open_clip.image_transform(32, is_train=True)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    for _ in build_train_data(config(demo_shards, workers=0), augment, byte_tokenizer).dataloader:
        pass
    assert torch.equal(torch.rand(3), expected)


def test_a_family_field_listing_group_ids_gives_each_sample_a_row_of_them():
    from training.trainer.data.samples import family_tensor
    from training.trainer.data.shards import family_of

    def sample(**meta):
        return {"json": json.dumps(meta).encode()}

    assert family_of(sample(family=3), "family") == 3 and family_of(sample(), "family") == -1
    assert family_of(sample(groups=[4, "x", -2, 7]), "groups") == (4, -1, -1, 7)
    assert family_tensor([3, -1]).tolist() == [3, -1]
    assert family_tensor([(4, 5), -1, (6, 7)]).tolist() == [[4, 5], [-1, -1], [6, 7]]  # none: -1 in every place
    with pytest.raises(DataError, match="must list the same number for every sample"):
        family_tensor([(4, 5), (6,)])

"""Webdataset tar shards: every kind of damage skipped and counted, unreadable and missing shards named,
sample ids from keys."""

import logging
import tarfile
import time
import tracemalloc
from dataclasses import replace

import pytest
from torchvision.transforms.functional import to_tensor

from helpers.data_utils import (
    byte_tokenizer,
    config,
    decode_texts,
    good,
    indices,
    png,
    write_hostile_shards,
    write_shard_with_a_huge_member,
    write_tar,
)
from helpers.run_utils import processes_running
from training.trainer.data import SKIP_REASONS, DataConfig, build_train_data, build_val_data
from training.trainer.data.samples import MAX_NAMED_SHARDS, SkipCounter, merged_shard_visits
from training.trainer.data.shards import check_sample_fields, check_shard_sample, read_shard


def test_every_kind_of_damage_is_skipped_and_counted(tmp_path):
    urls, good_keys, expected = write_hostile_shards(tmp_path / "hostile")
    cfg = DataConfig(val_data=urls, batch_size=4, workers=0, max_image_pixels=1000)
    batches = list(build_val_data(cfg, to_tensor, byte_tokenizer).dataloader)
    assert sorted(indices(batches)) == good_keys
    assert [text for b in batches for text in decode_texts(b[1])].count("caption 1") == 1  # the first copy wins
    totals = sum(batch[3].counts for batch in batches)
    assert dict(zip(SKIP_REASONS, totals.tolist())) == {reason: expected.get(reason, 0) for reason in SKIP_REASONS}
    shard_visits = merged_shard_visits(*(batch[3].shard_visits for batch in batches))
    b_tar, c_tar = urls.split("::")[1:]
    assert shard_visits == {b_tar: {"bad_tar": 1}, c_tar: {"unreadable_shard": 1}}  # the shards cut short, named


def test_training_survives_damage_in_workers_and_reports_skips(tmp_path):
    urls, good_keys, _ = write_hostile_shards(tmp_path / "hostile")
    cfg = DataConfig(
        train_data=urls,
        train_num_samples=48,
        batch_size=4,
        workers=2,
        max_image_pixels=1000,
        dataset_type="webdataset",
        dataset_resampled=True,
    )
    batches = list(build_train_data(cfg, to_tensor, byte_tokenizer).dataloader)
    assert len(batches) == 12 and all(len(batch[2]) == 4 for batch in batches)
    assert set(indices(batches)) <= set(good_keys)
    totals = dict(zip(SKIP_REASONS, sum(batch[3].counts for batch in batches).tolist()))
    assert all(totals[reason] > 0 for reason in ("bad_image", "unreadable_shard", "bad_tar", "duplicate_key"))


def test_a_reader_whose_shards_are_all_unreadable_stops_with_a_clear_error(tmp_path):
    directory = tmp_path / "shards"
    directory.mkdir()
    write_tar(directory / "good.tar", [good(key) for key in range(8)])
    (directory / "garbage.tar").write_bytes(b"not a tar file at all" * 100)
    urls = f"{directory}/good.tar::{directory}/garbage.tar"
    outcomes = []
    for rank in range(2):  # one rank draws the garbage shard
        cfg = DataConfig(train_data=urls, train_num_samples=16, batch_size=4, world_size=2, rank=rank, workers=0)
        try:
            outcomes.append(len(list(build_train_data(cfg, to_tensor, byte_tokenizer).dataloader)))
        except RuntimeError as error:
            assert "none of its shards yielded a usable sample" in str(error) and "bad_tar=1" in str(error)
            outcomes.append("error")
    assert sorted(outcomes, key=str) == [2, "error"]


def test_no_readable_shard_at_all_fails_before_training(tmp_path):
    directory = tmp_path / "shards"
    directory.mkdir()
    (directory / "0.tar").write_bytes(b"garbage")
    (directory / "1.tar").mkdir()
    cfg = DataConfig(train_data=f"{directory}/{{0..1}}.tar", train_num_samples=16, batch_size=4)
    with pytest.raises(RuntimeError, match="none of the 2 shards"):
        build_train_data(cfg, to_tensor, byte_tokenizer)


def test_missing_shards_are_named_before_training(demo_shards):
    cfg = config(demo_shards, train_data=str(demo_shards / "train/shard-{000000..000005}.tar"))
    with pytest.raises(FileNotFoundError, match="2 of the 6 shards.*shard-000004.tar"):
        build_train_data(cfg, to_tensor, byte_tokenizer)
    with pytest.raises(FileNotFoundError, match="val_data"):
        build_val_data(config(demo_shards, val_data=str(demo_shards / "nowhere.tar")), to_tensor, byte_tokenizer)


def test_sample_index_falls_back_to_a_stable_hash_of_the_key(tmp_path):
    directory = tmp_path / "shards"
    directory.mkdir()
    samples = [{"__key__": f"img-{n}", "png": png(), "txt": b"a caption"} for n in range(6)]
    samples += [
        {"__key__": "img-text-key", "png": png(), "txt": b"a caption", "json": b'{"key": "abc"}'},
        {"__key__": "img-huge-key", "png": png(), "txt": b"a caption", "json": b'{"key": "9' + b"9" * 30 + b'"}'},
        {"__key__": "img-int-key", "png": png(), "txt": b"a caption", "json": b'{"key": 42}'},
    ]
    write_tar(directory / "0.tar", samples)
    cfg = DataConfig(val_data=str(directory / "0.tar"), batch_size=9, workers=0)
    first = indices(build_val_data(cfg, to_tensor, byte_tokenizer).dataloader)
    again = indices(build_val_data(replace(cfg, workers=1), to_tensor, byte_tokenizer).dataloader)  # other process
    assert first == again and len(set(first)) == 9 and first[-1] == 42
    assert all(0 <= index < 2**63 for index in first)


def test_shards_whose_images_all_fail_to_decode_stop_with_a_clear_error(tmp_path):
    directory = tmp_path / "shards"
    directory.mkdir()
    write_tar(directory / "0.tar", [{**good(key), "png": b"not an image"} for key in range(8)])
    cfg = DataConfig(train_data=str(directory / "0.tar"), train_num_samples=8, batch_size=4, workers=0)
    with pytest.raises(RuntimeError, match="images in a row could not be decoded.*bad_image=1000"):
        list(build_train_data(cfg, to_tensor, byte_tokenizer).dataloader)


def test_failing_pipe_shards_are_skipped_and_counted_like_unreadable_local_shards(demo_shards, tmp_path):
    """A `pipe:` command that fails (a missing object behind `aws s3 cp`, a command not found) is a skipped
    shard visit, counted apart from skipped samples; the run goes on with the shards that stream."""
    from training import RunDir
    from training.main import main

    shards = [f"pipe:cat {demo_shards}/train/shard-{index:06d}.tar" for index in range(2)]
    failing = ["pipe:false", f"pipe:cat {tmp_path}/missing.tar"]
    summary = main(
        [
            "--train-data",
            "::".join(shards + failing),
            "--dataset-type",
            "webdataset",
            "--train-num-samples",
            "192",
            "--model",
            "adacl-tiny",
            "--batch-size",
            "32",
            "--epochs",
            "1",
            "--lr",
            "1e-3",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--logs",
            str(tmp_path),
            "--name",
            "pipes",
        ]
    )
    assert summary.step == 6
    [epoch] = RunDir(tmp_path / "pipes").metrics("epoch")
    # The epoch drew 192 of the 256 streamed samples; the failing pipes were visited at least once each.
    assert epoch["skipped/unreadable_shard"] >= 2 and epoch["skipped_shard_visits"] == epoch["skipped/unreadable_shard"]
    assert epoch["skipped_samples"] == 0
    line = next(line for line in (tmp_path / "pipes" / "out.log").read_text().splitlines() if "Epoch 0 done" in line)
    named = "; ".join(
        f"{url}: unreadable_shard {visits['unreadable_shard']}" for url, visits in epoch["skipped_shards"].items()
    )
    assert sorted(epoch["skipped_shards"]) == sorted(failing)  # the summary says which shards failed
    visits = epoch["skipped/unreadable_shard"]
    assert f"skipped shard visits: unreadable_shard {visits} ({named}), skipped samples: none" in line


def test_the_startup_check_skips_a_stalled_pipe_shard_and_probes_past_a_first_shard_without_images(tmp_path):
    """check_sample_fields reads each shard as training does (under the stall timeout); a dead `pipe:` command
    listed first and a first shard of text only are skipped for the shards after them."""
    write_tar(tmp_path / "good.tar", [good(key) for key in range(8)])
    write_tar(tmp_path / "text.tar", [{"__key__": f"{key:09d}", "txt": b"no image"} for key in range(80)])
    start = time.time()
    check_sample_fields(
        ["pipe:sleep 617", str(tmp_path / "text.tar"), str(tmp_path / "good.tar")],
        ["txt"],
        key_flag="--caption-key",
        data_flag="--train-data",
        timeout_s=1,
    )
    assert time.time() - start < 30 and processes_running(b"sleep 617") == []
    with pytest.raises(
        ValueError,
        match=r"^none of the first 64 samples of --train-data has an image field "
        r"\(jpg, jpeg, png, webp, gif\) \(in any of its first 2 readable shards\); their "
        r"fields are \['txt'\]",
    ):
        check_sample_fields(
            [str(tmp_path / "text.tar")] * 2, ["txt"], key_flag="--caption-key", data_flag="--train-data", timeout_s=1
        )


def test_oversized_images_and_captions_in_shards_are_skipped_unread(tmp_path):
    samples = [good(key) for key in range(6)]
    samples[1]["png"] += b"\0" * 2000  # a valid PNG with trailing bytes: over the cap, never decoded
    samples[2]["txt"] = b"a long caption " * 100
    write_tar(tmp_path / "caps.tar", samples)
    cfg = DataConfig(
        val_data=str(tmp_path / "caps.tar"), batch_size=4, workers=0, max_image_bytes=1500, max_caption_bytes=1000
    )
    batches = list(build_val_data(cfg, to_tensor, byte_tokenizer).dataloader)
    assert indices(batches) == [0, 3, 4, 5]
    totals = dict(zip(SKIP_REASONS, sum(batch[3].counts for batch in batches).tolist()))
    assert {reason: count for reason, count in totals.items() if count} == {
        "oversized_image": 1,
        "oversized_caption": 1,
    }


@pytest.mark.parametrize("as_pipe", [False, True])
def test_a_member_over_the_size_caps_is_skipped_from_its_header_unread(tmp_path, as_pipe):
    """A 256 MB image member (a sparse file) between good samples: counted as oversized_image, and never held in
    memory, from a file or through a `pipe:` command alike."""
    write_tar(tmp_path / "good.tar", [good(key) for key in range(4)])
    write_shard_with_a_huge_member(tmp_path / "huge.tar", tmp_path / "good.tar", 256 * 2**20)
    url = f"pipe:cat {tmp_path / 'huge.tar'}" if as_pipe else str(tmp_path / "huge.tar")
    counter = SkipCounter()
    tracemalloc.start()
    try:
        samples = list(read_shard(url, counter, max_member_bytes=2**20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    reasons = [
        check_shard_sample(
            sample,
            caption_keys=("txt",),
            family_field=None,
            seed=0,
            epoch=0,
            shard_run=(0, 0),
            max_image_bytes=2**20,
            max_caption_bytes=1000,
        )[0]
        for sample in samples
    ]
    assert reasons == [None, None, "oversized_image", None, None]
    assert counter.counts.sum() == 0  # a whole shard: nothing else counted


@pytest.mark.slow
def test_a_shard_cut_at_a_member_boundary_or_ending_in_a_lying_header_is_counted_and_named(tmp_path, caplog):
    write_tar(tmp_path / "good.tar", [good(key) for key in range(6)])
    data = (tmp_path / "good.tar").read_bytes()
    with tarfile.open(tmp_path / "good.tar") as tar:
        members = tar.getmembers()
    (tmp_path / "cut.tar").write_bytes(data[: members[9].offset])  # after the third sample's three members
    end = members[-1].offset_data + -(-members[-1].size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    lie = tarfile.TarInfo("000000099.png")
    lie.size = 50 * 10**9
    (tmp_path / "lying.tar").write_bytes(data[:end] + lie.tobuf() + b"x" * 1024)
    for name, count, error in (("cut", 3, "TarTruncated('the tar ends after"), ("lying", 7, "ReadError('unexpected")):
        counter = SkipCounter()
        with caplog.at_level(logging.WARNING):
            assert len(list(read_shard(str(tmp_path / f"{name}.tar"), counter, max_member_bytes=2**20))) == count
        assert dict(zip(SKIP_REASONS, counter.counts.tolist()))["bad_tar"] == 1
        assert f"shard {tmp_path / f'{name}.tar'} ended early (bad_tar): {error}" in caplog.text


def test_merged_shard_visits_sum_by_shard_and_name_the_first_shards_only():
    """An epoch's sums stay bounded however many shards are cut: the first MAX_NAMED_SHARDS shards seen are named
    (their later visits still summed), the visits of the others are left to the skip counts."""
    first = {f"s{i}.tar": {"bad_tar": 1} for i in range(MAX_NAMED_SHARDS - 1)}
    second = {"s0.tar": {"bad_tar": 2, "unreadable_shard": 1}, "late.tar": {"bad_tar": 1}, "later.tar": {"bad_tar": 5}}
    merged = merged_shard_visits(first, second)
    assert list(merged) == [*first, "late.tar"] and "later.tar" not in merged
    assert merged["s0.tar"] == {"bad_tar": 3, "unreadable_shard": 1}
    assert first["s0.tar"] == {"bad_tar": 1}  # the inputs are left as they were


def test_a_skip_counter_hands_over_the_shards_of_its_cut_visits_once():
    counter = SkipCounter()
    counter.add("bad_tar", shard="cut.tar")
    counter.add("bad_image")
    counts, shard_visits = counter.take()
    assert dict(zip(SKIP_REASONS, counts.tolist()))["bad_tar"] == 1 and shard_visits == {"cut.tar": {"bad_tar": 1}}
    assert counter.take().shard_visits == {} and int(counter.take().counts.sum()) == 0

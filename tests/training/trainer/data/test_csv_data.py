"""OpenCLIP's csv datasets (--dataset-type csv): rows of image path and caption, bad rows skipped and counted."""

import csv
import os
from dataclasses import replace

import pytest
import webdataset as wds
from torchvision.transforms.functional import to_tensor

from helpers.run_utils import tiny_argv
from training import ConfigError, RunDir
from training.main import main
from training.trainer.data import SKIP_REASONS, DataConfig, build_train_data, build_val_data
from training.trainer.data.sources.csv_file import CsvFile

NUM_GOOD = 64
# Rows 10-12: a missing image file, an empty caption, a row cut short before the caption.
BAD_ROWS = {"missing_image": 1, "empty_caption": 1, "missing_caption": 1}
GOOD_ROWS = [row for row in range(NUM_GOOD + 3) if row not in (10, 11, 12)]


@pytest.fixture(scope="module")
def csv_dataset(demo_shards, module_tmp):
    """A comma-separated file with OpenCLIP-style columns: NUM_GOOD demo images as PNG files, then bad rows."""
    root = module_tmp("csv")
    rows = []
    for sample in wds.WebDataset(str(demo_shards / "train" / "shard-000000.tar"), shardshuffle=False):
        if len(rows) == NUM_GOOD:
            break
        path = root / f"{sample['__key__']}.png"
        path.write_bytes(sample["png"])
        rows.append([str(path), sample["txt"].decode()])
    rows[10:10] = [[str(root / "gone.png"), "a caption"], [rows[0][0], "   "], [rows[0][0]]]
    with open(root / "train.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "caption"])
        writer.writerows(rows)
    return root / "train.csv"


def csv_config(path, **overrides):
    options = CsvFile.Options(
        csv_separator=",", csv_img_key=overrides.pop("csv_img_key", "image"), csv_caption_key="caption"
    )
    return replace(
        DataConfig(
            train_data=str(path),
            val_data=str(path),
            dataset_type="csv",
            batch_size=16,
            workers=0,
            source_options=options,
        ),
        **overrides,
    )


def test_rows_become_samples_indexed_by_row_number_and_bad_rows_are_counted(csv_dataset):
    info = build_train_data(csv_config(csv_dataset, train_num_samples=NUM_GOOD), to_tensor, lambda texts: texts)
    rows = list(csv.reader(open(csv_dataset)))[1:]
    skipped_per_epoch = []
    for epoch in range(3):
        info.set_epoch(epoch)
        batches = list(info.dataloader)
        assert len(batches) == NUM_GOOD // 16 and all(len(batch[2]) == 16 for batch in batches)
        seen = [index for batch in batches for index in batch[2].tolist()]
        assert sorted(seen) == GOOD_ROWS  # every good row once, in a new order each epoch
        assert all(list(batch[1]) == [rows[index][1] for index in batch[2].tolist()] for batch in batches)
        skipped_per_epoch.append(dict(zip(SKIP_REASONS, sum(batch[3].counts for batch in batches).tolist())))
    # A bad row is counted when the epoch's permutation reaches it before the last good row.
    assert all(counts[reason] <= 1 for counts in skipped_per_epoch for reason in BAD_ROWS)
    assert all(sum(counts.values()) == sum(counts[reason] for reason in BAD_ROWS) for counts in skipped_per_epoch)
    assert all(any(counts[reason] for counts in skipped_per_epoch) for reason in BAD_ROWS)


def test_validation_reads_every_row_once_in_order(csv_dataset):
    batches = list(build_val_data(csv_config(csv_dataset), to_tensor, lambda texts: texts).dataloader)
    assert [index for batch in batches for index in batch[2].tolist()] == GOOD_ROWS
    assert dict(zip(SKIP_REASONS, sum(batch[3].counts for batch in batches).tolist())) == {
        **dict.fromkeys(SKIP_REASONS, 0),
        **BAD_ROWS,
    }


def test_a_missing_column_names_the_flag(csv_dataset):
    with pytest.raises(ValueError, match=r"has no column 'filepath' \(--csv-img-key\)"):
        build_train_data(csv_config(csv_dataset, csv_img_key="filepath"), None, None)


def test_a_csv_dataset_trains_through_training_main(csv_dataset, tmp_path):
    argv = tiny_argv(
        tmp_path,
        "csv",
        *("--dataset-type", "csv", "--csv-separator", ",", "--csv-img-key", "image", "--csv-caption-key", "caption"),
        data=csv_dataset,
        batch_size=16,
        epochs=2,
    )
    with pytest.raises(ConfigError, match="--csv-caption-key"):
        main([*argv, "--csv-caption-key", "title", "--dry-run"])
    summary = main(argv)
    epochs = RunDir(tmp_path / "csv").metrics("epoch")
    assert summary.step == 2 * ((NUM_GOOD + 3) // 16)  # OpenCLIP's epoch: every row, whole batches
    # Each epoch reads all rows but the few left over; every bad row met is counted under its reason.
    assert sum(sum(e[f"skipped/{reason}"] for reason in BAD_ROWS) for e in epochs) >= 1
    assert all(e[f"skipped/{reason}"] <= 1 for e in epochs for reason in BAD_ROWS)


def test_devices_fifos_and_oversized_files_are_skipped_with_their_own_reasons(csv_dataset, tmp_path):
    """/dev/zero would be read until memory runs out and a FIFO without a writer waited on forever: neither is
    read (not_a_file); an image file over --max-image-bytes and a caption over --max-caption-bytes are skipped
    (oversized_image, oversized_caption), also one past csv's own field limit (131072 characters)."""
    good_rows = list(csv.reader(open(csv_dataset)))[1:9]
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    max_image = max(os.path.getsize(path) for path, _ in good_rows)
    big = tmp_path / "big.png"
    big.write_bytes(b"\0" * (max_image + 1))
    rows = [
        *good_rows,
        ["/dev/zero", "zeros"],
        [str(fifo), "a fifo"],
        [str(big), "too big"],
        [good_rows[0][0], "a caption longer than csv's own field limit " * 5000],
    ]
    path = tmp_path / "hostile.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([["image", "caption"], *rows])
    cfg = csv_config(path, max_image_bytes=max_image, max_caption_bytes=1000)
    batches = list(build_val_data(cfg, to_tensor, lambda texts: texts).dataloader)
    assert [index for batch in batches for index in batch[2].tolist()] == list(range(8))
    totals = dict(zip(SKIP_REASONS, sum(batch[3].counts for batch in batches).tolist()))
    assert {reason: count for reason, count in totals.items() if count} == {
        "not_a_file": 2,
        "oversized_image": 1,
        "oversized_caption": 1,
    }
    with pytest.raises(ConfigError, match="^--max-caption-bytes must be >= 1 byte, got 0$"):
        main(["--train-data", str(path), "--max-caption-bytes", "0", "--dry-run"])

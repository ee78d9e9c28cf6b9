"""Webdataset (and csv) streaming for training and validation, with OpenCLIP's behaviour plus what it lacks.

Batches are tuples `(images, texts, sample_index, skip_counts)`:
  images        float B x 3 x H x W, through the model's open_clip preprocess transform
  texts         LongTensor B x context, through the open_clip tokenizer
  sample_index  LongTensor B, a stable global id per sample: the json "key" field when it is a
                non-negative integer (img2dataset writes "000012345"), else a 63-bit hash of the
                tar member prefix `__key__` (blake2b, the same in every process and run). A dense
                per-sample state bank needs the json keys; `::` sources whose keys overlap (two
                img2dataset runs both start at 0) share ids, so give each source its own key range.
  skip_counts   LongTensor [len(SKIP_REASONS)]: samples this worker skipped, per reason, since its
                previous batch (workers are separate processes; summing over batches gives totals).

What OpenCLIP (3.3.0, `open_clip_train.data.get_wds_dataset`) does and we keep: shards from
brace-expanded `::`-separated sources; `--dataset-resampled` draws shards with replacement,
weighted per shard by `--train-data-upsampling-factors` (a source's factor applies to each of
its shards, as in OpenCLIP); otherwise shards are shuffled per epoch and split over ranks and
workers; a sample shuffle buffer; `num_batches` per epoch and rank, a whole number per worker.
Differences, each deliberate:
  - Built on webdataset's `gopen` / `tar_file_iterator` / `base_plus_ext` (not OpenCLIP's tar
    pipeline, which fails on webdataset >= 0.2.96), grouping members into samples ourselves so
    duplicates, truncation and unreadable shards are seen and counted instead of logged.
  - Every random choice is seeded by (seed, epoch, rank, reader): shard order, shard draws,
    sample shuffle, caption field, and the augmentation of each batch (torch and Python RNG are
    seeded per global batch inside the worker and restored after), so a batch's content does
    not depend on the process it is built in, and iterating a loader never moves the caller's
    global random state (the DataLoader's own base seed comes from a private generator).
  - Epoch length rounds down (OpenCLIP rounds up by default and repeats a few samples).
  - Exact mid-epoch resume (`skip_batches`): the DataLoader takes batches round-robin from its
    workers, so global batch g comes from reader g % W. A resumed loader rotates readers so its
    worker 0 plays reader skip_batches % W, and each reader drops its share of the skipped
    batches. Skipped batches are read, checked and image-decoded (needed to know exactly which
    samples the uninterrupted run dropped) but neither transformed nor tokenized. Skip counts
    met while fast-forwarding are not reported again (the interrupted run reported them).
    The stream depends on data, seed, batch_size, workers, world_size, caption_key and group_size:
    a resume must use the same values (store them with the checkpoint's data position).
    Residual inexactness: an image that decodes but makes the preprocess transform raise is
    dropped only when transformed, so inside the skipped range it shifts later batches by one.
  - The sample shuffle buffer is OpenCLIP's 5000 (initial 1000) capped at half the mean shard
    size (OpenCLIP's 5000 is half an img2dataset shard of 10000), so small shards keep the same
    shard-local mixing. Each pass over a reader's shards drains its buffer before the next pass
    (like OpenCLIP's `with_epoch` restarting its pipeline), so a pass never repeats a sample.
  - With several `caption_key` fields ("txt,txt_alt") each sample picks one uniformly, by a hash
    of (seed, epoch, sample_index); validation uses the first, or `val_caption_key` (train on
    pseudo captions, validate on gold ones).
  - `group_size` K > 1 (not in OpenCLIP): the shuffle buffer holds runs of K consecutive samples
    of a shard (positions 0..K-1, K..2K-1, ... of each shard visit) and shuffles them as units,
    so data written in families of K (e.g. one-edit siblings, docs/data.md) reaches a batch as
    whole families. The buffer keeps its size in samples (shuffle size / K units).
  - Validation reads every val shard once on every rank (OpenCLIP evaluates on rank 0 only),
    split over workers, unshuffled, with a partial last batch.

OpenCLIP's csv data (`--dataset-type csv`) goes through the same checks, decoding and batching
(`csv_rows` says how rows become samples).

Corrupt input never stops the loader: see SKIP_REASONS. Where it cannot go on, it says so
instead of looping forever: a training reader that has tried all of its shards without one
usable sample, or meets max(1000, 10 x shuffle buffer) undecodable images in a row, raises a
DataError (a RuntimeError) naming its shards; building the data raises FileNotFoundError naming
missing local shards and DataError when no shard opens as a tar.

Modules: `config` (DataConfig, skip reasons, DataError), `loader` (build_train_data,
build_val_data), `stream` (ShardStream, the per-reader stream), `shards` (reading and checking tar
shards), `position` (DataPosition, the checkpointed position), `csv_rows`, `synthetic`, and `samples`
(skip counting, per-sample checks, seeding).
"""
from .config import DATASET_TYPES, SKIP_REASONS, DataConfig, DataError, data_error_reason
from .csv_rows import CsvRow, CsvStream, read_csv_rows
from .loader import LoaderInfo, build_train_data, build_val_data
from .position import DataPosition
from .samples import SkipCounter
from .shards import IMAGE_EXTENSIONS, read_shard, sample_index_of
from .stream import ShardStream
from .synthetic import SyntheticDataset

__all__ = ["DATASET_TYPES", "IMAGE_EXTENSIONS", "SKIP_REASONS", "CsvRow", "CsvStream", "DataConfig", "DataError",
           "DataPosition", "LoaderInfo", "ShardStream", "SkipCounter", "SyntheticDataset", "build_train_data",
           "build_val_data", "data_error_reason", "read_csv_rows", "read_shard", "sample_index_of"]

"""OpenCLIP's csv data (`--dataset-type csv`, or `auto` for data ending in .csv/.tsv): one csv/tsv
file, `--csv-separator`, a header naming the `--csv-img-key` image-path and `--csv-caption-key`
caption columns.

Rows go through the same checks, decoding and batching as tar samples (`CsvStream`): sample_index
is the row number (0-based, after the header); a row whose image file is missing or whose caption
is empty or absent is skipped and counted under the same reasons as a tar sample. An image path is read
only when it names a regular file (a device such as /dev/zero would read until memory runs out, a
FIFO would wait for a writer forever: `not_a_file`), and only up to --max-image-bytes
(`oversized_image`); a caption over --max-caption-bytes is `oversized_caption`. An epoch is every
row (OpenCLIP's len(dataset)), in a seeded per-epoch permutation split over ranks and readers.
"""

from __future__ import annotations

import codecs
import csv
import os
import random
import stat
import tarfile
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable, Iterator

from open_clip_train.data import SharedEpoch

from ...flags import SAMPLE_ORDER, HelpGroup, flag
from ..config import DataConfig, DataError
from ..loader import batches_per_epoch, check_skip, stream_data, validation_batches
from ..ordered import OrderedPass, PassItem, PassSample
from ..samples import Candidate, SkipCounter, decode_caption, describe_counts, stable_hash
from ..source import DataSource, LoaderInfo, register_data_source
from ..stream import ShardStream

_FIELD_SIZE_LIMIT = 2**31 - 1  # the largest csv accepts


def csv_delimiter(separator: str) -> str:
    """--csv-separator as csv reads it: one character, where an escape typed in a shell ('\\t', a backslash and
    a t, as bash passes '\t') means the character it names."""
    delimiter = codecs.decode(separator, "unicode_escape") if "\\" in separator else separator
    if len(delimiter) != 1:
        raise ValueError("a separator is one character (a tab: --csv-separator '\\t'; a comma: --csv-separator ,)")
    return delimiter


@register_data_source("csv")
class CsvFile(DataSource):
    description = "a csv/tsv file of image paths and captions (--csv-img-key, --csv-caption-key)"
    suffixes = (".csv", ".tsv")

    @dataclass(frozen=True)
    class Options:
        FLAG_GROUP: ClassVar[str] = HelpGroup.DATA

        # An escape as typed in a shell ('\\t') means the character it names (`csv_delimiter`).
        csv_separator: str = flag(
            "\t", "For csv-like datasets, which separator to use.", resume=SAMPLE_ORDER, convert=csv_delimiter
        )
        csv_img_key: str = flag(
            "filepath", "For csv-like datasets, the name of the key for the image paths.", resume=SAMPLE_ORDER
        )
        csv_caption_key: str = flag(
            "title", "For csv-like datasets, the name of the key for the captions.", resume=SAMPLE_ORDER
        )

    def train_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable, epoch: int) -> LoaderInfo:
        rows = read_csv_rows(cfg.train_data, self.options(cfg), "train_data (--train-data)")
        num_readers = max(1, cfg.workers)
        num_batches = batches_per_epoch(cfg.train_num_samples or len(rows), cfg, num_readers)
        check_skip(cfg.skip_batches, num_batches)
        stream = CsvStream(
            rows=rows,
            cfg=cfg,
            preprocess=preprocess,
            tokenizer=tokenizer,
            shared_epoch=SharedEpoch(epoch),
            start_epoch=epoch,
            batches_per_reader=num_batches // num_readers,
        )
        info = stream_data(stream, cfg.workers, num_batches * cfg.batch_size, num_batches)
        info.data_size = info.sample_ids_below = len(rows)  # row k is sample k
        return info

    def val_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable) -> LoaderInfo:
        rows = read_csv_rows(cfg.val_data, self.options(cfg), "val_data (--val-data)")
        stream = CsvStream(
            rows=rows,
            cfg=cfg,
            preprocess=preprocess,
            tokenizer=tokenizer,
            shared_epoch=SharedEpoch(0),
            start_epoch=0,
            batches_per_reader=None,
        )
        num_samples = cfg.val_num_samples or len(rows)
        return stream_data(stream, cfg.workers, num_samples, validation_batches(num_samples, cfg.batch_size))

    def check_fields(self, cfg: DataConfig) -> None:
        """Up to CHECKED_ROWS rows spread over each file are read as training reads them: a file none of whose
        sampled rows is usable (image paths relative to another folder, say) stops the dry run, not epoch 0."""
        for data, data_flag in ((cfg.train_data, "train_data (--train-data)"), (cfg.val_data, "val_data (--val-data)")):
            if data is not None:
                check_sampled_rows(read_csv_rows(data, self.options(cfg), data_flag), data, data_flag, cfg)

    def ordered_pass(self, cfg: DataConfig, data: str | None, data_flag: str) -> OrderedPass:
        options = self.options(cfg)
        rows = read_csv_rows(data, options, data_flag)
        return CsvPass(
            rows,
            data,
            num_samples=len(rows),
            caption_field=options.csv_caption_key,
            max_image_bytes=cfg.max_image_bytes,
            max_caption_bytes=cfg.max_caption_bytes,
        )


@dataclass(frozen=True)
class CsvRow:
    """One data row of a csv file: image path and caption (None where the row lacks the column)."""

    image_path: str | None
    caption: str | None


def read_csv_rows(path: str | None, options: CsvFile.Options, data_flag: str) -> tuple[CsvRow, ...]:
    """The rows of OpenCLIP's csv data (a header naming --csv-img-key and --csv-caption-key columns).

    Row k (0-based, after the header) is sample k: its sample_index. A row with too few fields keeps
    its place and is skipped when read (missing_image / missing_caption), like a bad tar sample. A field
    of any length is read (csv's own limit, 131072 characters, would stop at one long caption); a caption
    over --max-caption-bytes is skipped when read (oversized_caption).
    """
    if path is None or not os.path.isfile(path):
        raise FileNotFoundError(f"{data_flag}: {path} does not exist; --dataset-type csv reads one csv/tsv file")
    previous_limit = csv.field_size_limit(_FIELD_SIZE_LIMIT)
    try:
        rows = _rows(path, options, data_flag)
    except UnicodeDecodeError as error:
        if tarfile.is_tarfile(path):
            raise ValueError(
                f"{data_flag}: {path} is a tar archive, not a csv file: pass --dataset-type webdataset (or auto)"
            ) from None
        raise ValueError(
            f"{data_flag}: {path} is not utf-8 text ({error.reason} at byte {error.start}); "
            "--dataset-type csv reads a utf-8 csv/tsv file"
        ) from None
    finally:
        csv.field_size_limit(previous_limit)
    if not rows:
        raise ValueError(f"{data_flag}: {path} has a header but no rows")
    return rows


def _rows(path: str, options: CsvFile.Options, data_flag: str) -> tuple[CsvRow, ...]:
    """The file's data rows, after its header names the two columns."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter=options.csv_separator)
        header = next(reader, [])
        missing = [
            f"{column!r} ({option})"
            for column, option in (
                (options.csv_img_key, "--csv-img-key"),
                (options.csv_caption_key, "--csv-caption-key"),
            )
            if column not in header
        ]
        if missing:
            raise ValueError(
                f"{data_flag}: {path} has no column {' or '.join(missing)}; its header is {header} "
                f"with --csv-separator {options.csv_separator!r}; pass the flags naming its columns"
            )
        image_column, caption_column = header.index(options.csv_img_key), header.index(options.csv_caption_key)
        rows = []
        first_line = reader.line_num + 1
        for row in reader:
            check_row_lines(row, first_line, reader.line_num, options.csv_separator, path, data_flag)
            rows.append(
                CsvRow(
                    row[image_column] if len(row) > image_column else None,
                    row[caption_column] if len(row) > caption_column else None,
                )
            )
            first_line = reader.line_num + 1
        return tuple(rows)


def check_row_lines(row: list[str], first_line: int, last_line: int, separator: str, path: str, data_flag: str) -> None:
    """A row read from several lines is a quoted field with line breaks; one whose field also holds the separator
    swallowed whole rows after it (an unbalanced quote): a ValueError naming the lines, instead of an epoch
    silently made of fewer rows than the file has lines."""
    if last_line > first_line and any("\n" in field and separator in field for field in row):
        raise ValueError(
            f'{data_flag}: {path}: the row on line {first_line} runs to line {last_line}: a quote (") in it opens a '
            f"field that swallows the {last_line - first_line} lines after it, whose rows would be lost; close or "
            "remove that quote"
        )


CHECKED_ROWS = 16


def check_sampled_rows(rows: tuple[CsvRow, ...], path: str, data_flag: str, cfg: DataConfig) -> None:
    """Raise ValueError when none of up to CHECKED_ROWS rows spread evenly over `rows` passes training's checks."""
    sampled = sorted({index * len(rows) // CHECKED_ROWS for index in range(CHECKED_ROWS)})
    reasons = {}
    for index in sampled:
        reason, _ = check_row(
            rows[index], index, max_image_bytes=cfg.max_image_bytes, max_caption_bytes=cfg.max_caption_bytes
        )
        if reason is None:
            return
        reasons[reason] = reasons.get(reason, 0) + 1
    first = rows[sampled[0]]
    raise ValueError(
        f"{data_flag}: none of {len(sampled)} rows sampled from {path} is usable "
        f"({', '.join(f'{reason} {count}' for reason, count in reasons.items())}); row {sampled[0]} "
        f"has image {first.image_path!r} (relative paths are read from {os.getcwd()}); fix the paths "
        "or run from the folder they are relative to"
    )


class CsvStream(ShardStream):
    """ShardStream's batches from csv rows: image files read by path, the caption from its column.

    Training: each epoch a seeded permutation of the rows, split over ranks and readers (passes
    repeat it should bad rows leave a reader short). Validation: the rows in order.
    """

    def __init__(
        self,
        *,
        rows: tuple[CsvRow, ...],
        cfg: DataConfig,
        preprocess: Callable,
        tokenizer: Callable,
        shared_epoch: SharedEpoch,
        start_epoch: int,
        batches_per_reader: int | None,
    ) -> None:
        super().__init__(
            urls=(),
            weights=None,
            cfg=cfg,
            preprocess=preprocess,
            tokenizer=tokenizer,
            shared_epoch=shared_epoch,
            start_epoch=start_epoch,
            batches_per_reader=batches_per_reader,
            shuffle_size=0,
        )
        self.rows = rows

    def _validation_candidates(self, worker: int, num_workers: int, counter: SkipCounter) -> Iterator[Candidate]:
        return self._row_candidates(range(worker, len(self.rows), num_workers), counter)

    def _training_candidates(
        self, epoch: int, reader: int, num_readers: int, counter: SkipCounter
    ) -> Iterator[Candidate]:
        order = random.Random(stable_hash(self.cfg.seed, epoch, "row order")).sample(
            range(len(self.rows)), len(self.rows)
        )
        mine = order[self.cfg.rank :: self.cfg.world_size][reader::num_readers]
        while True:
            found = False
            for candidate in self._row_candidates(mine, counter):
                found = True
                yield candidate
            if not found:
                raise DataError(
                    f"rank {self.cfg.rank} reader {reader}: none of its {len(mine)} csv rows yielded "
                    f"a usable sample (skips: {describe_counts(counter.counts)}); check the image paths"
                )

    def _row_candidates(self, indices: Iterable[int], counter: SkipCounter) -> Iterator[Candidate]:
        for index in indices:
            reason, candidate = check_row(
                self.rows[index],
                index,
                max_image_bytes=self.cfg.max_image_bytes,
                max_caption_bytes=self.cfg.max_caption_bytes,
            )
            if reason is not None:
                counter.add(reason)
            else:
                yield candidate


def check_row(
    row: CsvRow, index: int, *, max_image_bytes: int, max_caption_bytes: int
) -> tuple[str | None, Candidate | None]:
    """Training's checks of csv row `index` (its caption, then its image file read as bytes): (None, the
    candidate) or (the skip reason, None)."""
    reason, text = decode_caption(
        None if row.caption is None else row.caption.encode("utf-8"), max_bytes=max_caption_bytes
    )
    if not row.image_path:
        reason = "missing_image"
    if reason is not None:
        return reason, None
    reason, image_bytes = read_image_file(row.image_path, max_image_bytes)
    if reason is not None:
        return reason, None
    return None, Candidate(index, text, image_bytes, shard_run=(0, index))  # rows are permuted, never buffer-shuffled


def read_image_file(path: str, max_bytes: int) -> tuple[str | None, bytes]:
    """(None, the bytes of the regular file at `path`) or (the skip reason, b""): missing_image for a path that is
    missing, unreadable or a directory, not_a_file for a device, FIFO or socket (never opened, as opening some
    devices acts; the file opened is checked again, without waiting for a FIFO's writer, should the path have
    changed meanwhile), oversized_image for a file of more than `max_bytes` bytes (at most one byte more is
    read, so a file that grows while it is read is caught too), bad_path for a path no file can have (a NUL byte,
    which the OS cannot take)."""
    if "\0" in path:
        return "bad_path", b""
    try:
        reason = _file_kind_reason(os.stat(path).st_mode)
        if reason is not None:
            return reason, b""
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY), "rb") as file:
            reason = _file_kind_reason(os.fstat(file.fileno()).st_mode)
            data = b"" if reason is not None else file.read(max_bytes + 1)
    except OSError:
        return "missing_image", b""
    if reason is not None:
        return reason, b""
    return ("oversized_image", b"") if len(data) > max_bytes else (None, data)


def _file_kind_reason(mode: int) -> str | None:
    """None for a regular file; the skip reason for anything else."""
    if stat.S_ISREG(mode):
        return None
    return "missing_image" if stat.S_ISDIR(mode) else "not_a_file"


@dataclass(frozen=True)
class CsvPass(OrderedPass):
    """The rows in file order."""

    rows: tuple[CsvRow, ...]
    path: str
    num_samples: int
    caption_field: str
    max_image_bytes: int
    max_caption_bytes: int

    def items(self, events: SkipCounter) -> Iterator[PassItem]:
        for index, row in enumerate(self.rows):
            reason, candidate = check_row(
                row, index, max_image_bytes=self.max_image_bytes, max_caption_bytes=self.max_caption_bytes
            )
            yield (
                reason
                if candidate is None
                else PassSample(row.image_path, self.path, candidate.text, candidate.image_bytes)
            )

"""Webdataset tar shards: reading one shard visit into samples, and checking the shards before training."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import tarfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from webdataset.tariterators import base_plus_ext

from .config import DataError
from .pipes import open_shard
from .samples import NO_FAMILY, Candidate, Family, SkipCounter, decode_caption, describe_counts, stable_hash

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif")  # a gif is read as its first frame
# Skip reasons that count shard visits cut short, not samples (the epoch log reports them apart).
SHARD_SKIP_REASONS = ("unreadable_shard", "bad_tar")
# Samples read per shard before any work to check that the caption and image fields exist, and the readable
# shards probed so before the data is refused.
FIELD_PROBE_SAMPLES = 64
FIELD_PROBE_SHARDS = 4
_META_MEMBER = re.compile(r"__[^/]*__($|/)")  # webdataset's meta members (its tar_file_iterator's skip_meta)

logger = logging.getLogger(__name__)


def read_shard(
    url: str, counter: SkipCounter, timeout_s: float = 0, max_member_bytes: int | None = None
) -> Iterator[dict]:
    """The samples of one shard visit: {"__key__", "__url__", ext: bytes}; duplicates skipped.

    Members are grouped by key prefix (webdataset's `base_plus_ext`); a key seen before in this
    shard, adjacent or not, makes the whole later sample a duplicate. A member of more than `max_member_bytes`
    (None: no bound) is never read: its size is known from its header, and it stands in the sample as an
    `UnreadMember`, whose length is that size, so the sample's size checks skip it. A failure while opening, or a
    `pipe:` command that exits non-zero (a missing object behind `aws s3 cp`, `curl -f`), counts
    `unreadable_shard`, a tar format error or truncation `bad_tar` (a tar that ends without its end-of-archive
    blocks included: a copy cut short at a member boundary); either ends the visit after the samples read so far.
    So does a `pipe:` command that sends no data for `timeout_s` seconds (`unreadable_shard`; it is ended,
    training.trainer.data.pipes; 0: no timeout).
    """
    try:
        stream = open_shard(url, timeout_s)
    except Exception as error:  # noqa: BLE001 - missing, permission, directory, failing pipe: never fatal mid-run
        counter.add("unreadable_shard", shard=url)
        _warn_once(url, f"skipping unreadable shard {url}: {error!r}")
        return
    seen: set[str] = set()
    errors: list[Exception] = []

    def emit(sample: dict | None) -> Iterator[dict]:
        if sample is None:
            return
        if sample["__key__"] in seen:
            counter.add("duplicate_key")
            return
        seen.add(sample["__key__"])
        yield sample

    current = None
    try:
        for name, data in tar_members(stream, max_member_bytes):
            prefix, suffix = base_plus_ext(name)
            if prefix is None:
                continue
            suffix = suffix.lower()
            if current is None or prefix != current["__key__"] or suffix in current:
                yield from emit(current)
                current = {"__key__": prefix, "__url__": url}
            current[suffix] = data
    except Exception as error:  # noqa: BLE001 - tarfile raises ReadError / EOFError / OSError on corrupt streams
        errors.append(error)
    finally:
        try:
            stream.close()
        except Exception as error:  # noqa: BLE001 - webdataset's Pipe raises on a non-zero exit: the first cause
            errors.insert(0, error)
    yield from emit(current)
    if errors:
        reason = "unreadable_shard" if isinstance(errors[0], OSError) else "bad_tar"
        counter.add(reason, shard=url)
        _warn_once(url, f"shard {url} ended early ({reason}): {errors[0]!r}")


class UnreadMember(bytes):
    """A tar member left unread for its size: it holds no bytes, but its length is the size its header gives, so
    a size check (--max-image-bytes, --max-caption-bytes) skips its sample as it would the whole member."""

    def __new__(cls, size: int) -> "UnreadMember":
        member = super().__new__(cls)
        member.size = size
        return member

    def __len__(self) -> int:
        return self.size


class TarTruncated(tarfile.ReadError):
    """The tar stream ended without its end-of-archive blocks: a copy or a download cut short."""


class _EndNotingTarInfo(tarfile.TarInfo):
    """Notes on its TarFile when the archive's end-of-archive block was read: tarfile ends the iteration alike at
    that block and at a stream cut short, and only the first is a whole archive."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tar)
        except tarfile.EOFHeaderError:
            tar.end_of_archive_read = True
            raise


def tar_members(stream, max_member_bytes: int | None) -> Iterator[tuple[str, bytes]]:
    """(name, data) of each regular member of the tar `stream` (webdataset's `__...__` meta members left out), in
    order, read one at a time; a member of more than `max_member_bytes` is skipped from its header, its data passed
    over unread (an `UnreadMember`). TarTruncated when the stream ends before the end-of-archive blocks."""
    tar = tarfile.open(fileobj=stream, mode="r|*", tarinfo=_EndNotingTarInfo)
    tar.end_of_archive_read = False
    for member in tar:
        tar.members = []  # a stream of any length: keep no list of the members passed
        if not member.isreg() or _META_MEMBER.match(member.name):
            continue
        if max_member_bytes is not None and member.size > max_member_bytes:
            yield member.name, UnreadMember(member.size)
            continue
        yield member.name, tar.extractfile(member).read()
    if not tar.end_of_archive_read:
        raise TarTruncated(
            f"the tar ends after {tar.offset} bytes without its end-of-archive blocks (a copy or a download cut short?)"
        )


_warned_shards: set[str] = set()  # per process: a resampled bad shard would otherwise warn at every draw


def _warn_once(url: str, message: str) -> None:
    if url not in _warned_shards:
        _warned_shards.add(url)
        logger.warning(message)


def check_shard_sample(
    sample: dict,
    *,
    caption_keys: tuple[str, ...],
    family_field: str | None,
    seed: int,
    epoch: int,
    shard_run: tuple[int, int],
    max_image_bytes: int,
    max_caption_bytes: int,
    sample_index_limit: int | None = None,
) -> tuple[str | None, Candidate | None]:
    """Training's checks of one tar sample that need no image decoding: (None, the candidate) or (the
    skip reason, None). With several caption keys, the one read is drawn by (seed, epoch, sample). With
    `sample_index_limit` (a loss's per-sample state) the id must be the json "key", an integer below it."""
    image_key = next((ext for ext in IMAGE_EXTENSIONS if ext in sample), None)
    if image_key is None:
        return "missing_image", None
    if len(sample[image_key]) > max_image_bytes:
        return "oversized_image", None
    try:
        sample_index = sample_index_of(sample)
        family = NO_FAMILY if family_field is None else family_of(sample, family_field)
        if sample_index_limit is not None and not usable_sample_key(json_sample_key(sample), sample_index_limit):
            return "bad_sample_key", None
    except ValueError:
        return "bad_json", None
    field = caption_keys[0]
    if len(caption_keys) > 1:
        field = caption_keys[stable_hash(seed, epoch, sample_index, "caption") % len(caption_keys)]
    reason, text = decode_caption(sample.get(field), max_bytes=max_caption_bytes)
    if reason is not None:
        return reason, None
    return None, Candidate(sample_index, text, sample[image_key], shard_run, family)


def sample_index_of(sample: dict) -> int:
    """The json "key" when it is a non-negative integer, else a 63-bit hash of `__key__`.

    Raises ValueError when a json member is present but does not parse.
    """
    key = json_sample_key(sample)
    return key if key is not None else stable_hash(sample["__key__"]) >> 1


def json_sample_key(sample: dict) -> int | None:
    """The json "key" (an integer, or a string of digits) when it is a non-negative integer that fits a LongTensor;
    None when there is none (no json, no key, a negative, fractional, non-numeric or too large one).

    Raises ValueError when a json member is present but does not parse.
    """
    if "json" not in sample:
        return None
    meta = json.loads(sample["json"])  # JSONDecodeError and UnicodeDecodeError are ValueErrors
    key = meta.get("key") if isinstance(meta, dict) else None
    if isinstance(key, str) and key.isascii() and key.isdigit():
        key = int(key)
    return key if _is_long_id(key) else None


def usable_sample_key(key: int | None, limit: int) -> bool:
    """Whether a sample's key can index a per-sample state of `limit` rows (--data-size)."""
    return key is not None and key < limit


def family_of(sample: dict, field: str) -> Family:
    """The json `field` when it is a non-negative integer (a family id), or the ids of a list of them (group ids,
    one per kind, NO_FAMILY where an entry is not one); else NO_FAMILY.

    Raises ValueError when a json member is present but does not parse.
    """
    meta = json.loads(sample["json"]) if "json" in sample else None
    family = meta.get(field) if isinstance(meta, dict) else None
    if isinstance(family, list):
        return tuple(group if _is_long_id(group) else NO_FAMILY for group in family)
    return family if _is_long_id(family) else NO_FAMILY


def _is_long_id(value: object) -> bool:
    """A non-negative integer (not a bool) that fits a LongTensor."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _is_local(url: str) -> bool:
    return "://" not in url and not url.startswith("pipe:")


def check_shards(urls: Sequence[str], flag: str) -> None:
    """Missing local shards are an error naming them; so is having no readable shard at all."""
    if not urls:
        raise ValueError(f"{flag} expands to no shards")
    missing = [url for url in urls if _is_local(url) and not os.path.exists(url)]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of the {len(urls)} shards given by {flag} do not exist, e.g. {missing[:3]}. "
            "Check the path and the brace range (e.g. 'dir/shard-{000000..000007}.tar')."
        )
    local = [url for url in urls if _is_local(url)]
    if local and len(local) == len(urls) and not any(_opens_as_tar(url) for url in local):
        raise DataError(
            f"none of the {len(urls)} shards given by {flag} can be read as a tar "
            f"(e.g. {local[:3]}); check the files and their permissions."
        )


def _opens_as_tar(path: str) -> bool:
    """Whether the file opens as a (possibly compressed) tar with a first member; reads one header."""
    try:
        with open(path, "rb") as file, tarfile.open(fileobj=file, mode="r|*") as tar:
            return tar.next() is not None
    except Exception:  # noqa: BLE001 - any failure means "not readable as a shard"
        return False


def check_sample_fields(
    urls: Iterable[str],
    caption_keys: Sequence[str],
    *,
    key_flag: str,
    data_flag: str,
    timeout_s: float = 0,
    max_member_bytes: int | None = None,
) -> None:
    """A ValueError naming the fields the data has when none of the first FIELD_PROBE_SHARDS readable shards has
    samples with one of `caption_keys` (read with `key_flag`) and an image; a DataError when no sample is
    readable at all.

    Each shard is read as training reads it (`read_shard`, under the stall timeout `timeout_s`, members of more
    than `max_member_bytes` left unread): an unreadable
    or stalled shard is skipped and counted, and the next one probed, so neither a dead `pipe:` command listed
    first nor a first shard without images (a text-only part of the set) stops a run whose other shards are fine.
    """
    counter = SkipCounter()
    fields: set[str] = set()
    probed = 0
    for url in urls:
        shard_fields = fields_of(
            itertools.islice(read_shard(url, counter, timeout_s, max_member_bytes), FIELD_PROBE_SAMPLES)
        )
        if shard_fields.issuperset(caption_keys) and shard_fields.intersection(IMAGE_EXTENSIONS):
            return
        fields |= shard_fields
        probed += bool(shard_fields)
        if probed == FIELD_PROBE_SHARDS:
            break
    if not fields:
        raise DataError(
            f"{data_flag} holds no readable sample (skips: {describe_counts(counter.counts)}); check that "
            "the shards are img2dataset-style webdataset tars (<key>.jpg|png, <key>.txt)"
        )
    where = f"none of the first {FIELD_PROBE_SAMPLES} samples of {data_flag}"
    shards = f" (in any of its first {probed} readable shards)" if probed > 1 else ""
    if not fields.intersection(IMAGE_EXTENSIONS):
        raise ValueError(
            f"{where} has an image field ({', '.join(IMAGE_EXTENSIONS)}){shards}; their fields are "
            f"{sorted(fields)}: write the images as <key>.jpg|png|webp (img2dataset's layout)"
        )
    missing = next((key for key in caption_keys if key not in fields), None)
    if missing is None:
        raise ValueError(
            f"{where} has both an image and {', '.join(caption_keys)} in one shard{shards}; their fields "
            f"are {sorted(fields)}: write each sample's image and captions into the same shard"
        )
    text_fields = sorted(fields - set(IMAGE_EXTENSIONS) - {"json"})
    raise ValueError(
        f"{key_flag} {missing}: {where} has a field {missing!r}{shards}; their fields are "
        f"{sorted(fields)}: pass {key_flag} with one of {text_fields or sorted(fields)}"
    )


def fields_of(samples: Iterable[dict]) -> set[str]:
    """The member names (extensions) the samples have, webdataset's own keys (`__key__`, `__url__`) left out."""
    return {name for sample in samples for name in sample if not name.startswith("__")}


def declared_dataset_size(urls: Sequence[str]) -> int | None:
    """Sum of the shards' entries in their directories' sizes.json; None if any is unknown."""
    sizes_by_dir: dict[str, dict] = {}
    total = 0
    for url in urls:
        directory, name = os.path.split(url)
        if directory not in sizes_by_dir:
            sizes_file = Path(directory) / "sizes.json"
            sizes_by_dir[directory] = json.loads(sizes_file.read_text()) if sizes_file.is_file() else {}
        if name not in sizes_by_dir[directory]:
            return None
        total += int(sizes_by_dir[directory][name])
    return total

"""What every reader shares, whatever its source: per-reason skip counts (and the shards whose visits were cut
short), the checks of one sample's caption and image, and hashing and seeding that are the same in every process
and run."""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
import warnings
from dataclasses import dataclass
from typing import Dict, Iterator, Mapping, NamedTuple, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image

from .config import SKIP_REASONS, DataError

NO_FAMILY = -1  # the family id of a sample without one
# A sample's family: one id, or (data whose json lists them) a fixed number of group ids, each of its own kind.
Family = Union[int, Tuple[int, ...]]


# {shard url: {skip reason: visits}}: the shard visits cut short (unreadable_shard, bad_tar), by shard.
ShardVisits = Dict[str, Dict[str, int]]
# Shards an epoch summary names: a count alone does not say which file to copy again, but a data set with
# thousands of bad shards must not grow the summary (or the checkpointed sums) without bound.
MAX_NAMED_SHARDS = 8


class Skipped(NamedTuple):
    """What a reader skipped since its previous batch: a batch's 4th element."""

    counts: torch.Tensor  # per SKIP_REASONS
    shard_visits: ShardVisits  # the visits among `counts` that a shard cut short, by shard


def no_skips() -> Skipped:
    """The skips of a batch from data that skips nothing (a map-style dataset)."""
    return Skipped(torch.zeros(len(SKIP_REASONS), dtype=torch.long), {})


def merged_shard_visits(*visits: Mapping[str, Mapping[str, int]]) -> ShardVisits:
    """The visits summed by shard and reason, naming the first MAX_NAMED_SHARDS shards in order of appearance;
    a later shard's visits are left out here (the skip counts still count them)."""
    merged: ShardVisits = {}
    for shard_visits in visits:
        for shard, by_reason in shard_visits.items():
            if shard not in merged and len(merged) == MAX_NAMED_SHARDS:
                continue
            counts = merged.setdefault(shard, {})
            for reason, count in by_reason.items():
                counts[reason] = counts.get(reason, 0) + int(count)
    return merged


class SkipCounter:
    """Per-reason skip counts of one reader since its previous batch, and the shards of the visits among them
    that were cut short."""

    def __init__(self) -> None:
        self.counts = np.zeros(len(SKIP_REASONS), dtype=np.int64)
        self.shard_visits: ShardVisits = {}

    def add(self, reason: str, shard: str | None = None) -> None:
        """Count a skip; `shard` names the shard of a visit cut short."""
        self.counts[SKIP_REASONS.index(reason)] += 1
        if shard is not None:
            by_reason = self.shard_visits.setdefault(shard, {})
            by_reason[reason] = by_reason.get(reason, 0) + 1

    def take(self) -> Skipped:
        skipped = Skipped(torch.from_numpy(self.counts), self.shard_visits)
        self.counts, self.shard_visits = np.zeros_like(self.counts), {}
        return skipped


@dataclass(frozen=True)
class Candidate:
    """A sample that passed the cheap checks; its image is still undecoded bytes."""

    sample_index: int
    text: str
    image_bytes: bytes
    shard_run: tuple[int, int]  # (shard visit, position in the shard // group_size): the shuffle's unit
    family: Family = NO_FAMILY  # read only when DataConfig.family_field is set


def family_tensor(families: Sequence[Family]) -> torch.Tensor:
    """B int64 family ids, or B x K when the samples list K group ids each (a sample without any gets K times
    NO_FAMILY); samples listing different numbers of ids are a DataError naming the field's contract."""
    widths = {len(family) for family in families if isinstance(family, tuple)}
    if not widths:
        return torch.tensor(families, dtype=torch.long)
    if len(widths) > 1:
        raise DataError(
            f"the samples' family fields list {sorted(widths)} group ids: a data set whose json lists group ids "
            "must list the same number for every sample (-1 for a group it is in none of)"
        )
    (width,) = widths
    return torch.tensor([family if isinstance(family, tuple) else (family,) * width for family in families])


def decode_caption(data: bytes | None, *, max_bytes: int) -> tuple[str | None, str]:
    """(skip reason or None, stripped caption); a caption of more than `max_bytes` bytes is skipped before it is
    decoded (tokenizing megabytes of text costs seconds per sample)."""
    if data is None:
        return "missing_caption", ""
    if len(data) > max_bytes:
        return "oversized_caption", ""
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return "non_utf8_caption", ""
    return (None, text) if text else ("empty_caption", "")


def decode_image(data: bytes, max_pixels: int) -> tuple[Image.Image | None, str | None]:
    """(RGB image, None) or (None, skip reason); the size check reads only the header."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.width * image.height > max_pixels:
                return None, "huge_image"
            return rgb_image(image), None
    except Image.DecompressionBombError:
        return None, "huge_image"
    except Exception:  # noqa: BLE001 - PIL raises many types (OSError, SyntaxError, ValueError, ...) on bad bytes
        return None, "bad_image"


# PIL's integer and float grey modes: `convert("RGB")` clips their values at 255, so a 16-bit PNG turns white.
WIDE_GREY_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")
WIDE_GREY_MAX = 65535  # a 16-bit PNG's white; PIL opens 16-bit greys as I;16 (or I)


def rgb_image(image: Image.Image) -> Image.Image:
    """`image` (its first frame, for an animated one) as 8-bit RGB with the same look: 16-bit and other wide grey
    values are scaled from 0..65535 to 0..255 (clipped outside it) instead of clipped at 255; every other mode
    (palette, CMYK, 1-bit, with alpha) is PIL's own conversion."""
    if image.mode not in WIDE_GREY_MODES:
        return image.convert("RGB")
    grey = np.asarray(image, dtype=np.float64) * (255 / WIDE_GREY_MAX)
    return Image.fromarray(np.clip(np.rint(grey), 0, 255).astype(np.uint8), mode="L").convert("RGB")


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's CPU RNG and Python's `random` for the block, then restore both."""
    python_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)


def stable_hash(*parts: object) -> int:
    """A 64-bit hash of the parts' reprs, identical in every process (unlike `hash`)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def describe_counts(counts: np.ndarray) -> str:
    return ", ".join(f"{reason}={int(n)}" for reason, n in zip(SKIP_REASONS, counts) if n) or "none"

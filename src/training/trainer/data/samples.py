"""What every reader shares, whatever its source: per-reason skip counts, the checks of one sample's
caption and image, and hashing and seeding that are the same in every process and run."""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
import warnings
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from PIL import Image

from .config import SKIP_REASONS

FAMILY_FIELD = "family"  # the json field data written in families (training.synthetic_scenes) holds its ids in
NO_FAMILY = -1  # the family id of a sample without one


class SkipCounter:
    """Per-reason skip counts of one reader since its previous batch."""

    def __init__(self) -> None:
        self.counts = np.zeros(len(SKIP_REASONS), dtype=np.int64)

    def add(self, reason: str) -> None:
        self.counts[SKIP_REASONS.index(reason)] += 1

    def take(self) -> torch.Tensor:
        counts, self.counts = self.counts, np.zeros_like(self.counts)
        return torch.from_numpy(counts)


@dataclass(frozen=True)
class Candidate:
    """A sample that passed the cheap checks; its image is still undecoded bytes."""

    sample_index: int
    text: str
    image_bytes: bytes
    shard_run: tuple[int, int]  # (shard visit, position in the shard // group_size): the shuffle's unit
    family: int = NO_FAMILY  # read only when DataConfig.family_field is set


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
            return image.convert("RGB"), None
    except Image.DecompressionBombError:
        return None, "huge_image"
    except Exception:  # noqa: BLE001 - PIL raises many types (OSError, SyntaxError, ValueError, ...) on bad bytes
        return None, "bad_image"


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

"""Helpers the data pipeline's tests share: a tokenizer that decodes back, the demo shards' config,
batch comparisons, and small shards written sample by sample (with every kind of damage)."""

import io
import json
import os
import tarfile
from dataclasses import replace
from pathlib import Path

import torch
import webdataset as wds
from PIL import Image

from training.trainer.data import DataConfig

TRAIN = "train/shard-{000000..000003}.tar"
TEXT_BYTES = 128


def byte_tokenizer(texts):
    """UTF-8 bytes padded to TEXT_BYTES: a tokenizer whose output decodes back to the caption."""
    rows = [list(text.encode()) + [0] * (TEXT_BYTES - len(text.encode())) for text in texts]
    return torch.tensor(rows, dtype=torch.long)


def decode_texts(tokens):
    return [bytes(row[row > 0].tolist()).decode() for row in tokens]


def config(root, **overrides):
    return replace(DataConfig(train_data=str(root / TRAIN), batch_size=32, workers=0, seed=7), **overrides)


def indices(batches):
    return torch.cat([batch[2] for batch in batches]).tolist()


def assert_same_batches(actual, expected):
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        for got_tensor, want_tensor in zip(got[:3], want[:3]):
            assert torch.equal(got_tensor, want_tensor)


def png(size=8, colour=(200, 30, 30)):
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def good(key):
    return {
        "__key__": f"{key:09d}",
        "png": png(),
        "txt": f"caption {key}".encode(),
        "json": json.dumps({"key": f"{key:09d}"}).encode(),
    }


def write_tar(path, samples):
    with wds.TarWriter(str(path), encoder=False) as sink:
        for sample in samples:
            sink.write(sample)


def write_shard_with_a_huge_member(path: Path, shard: Path, size: int) -> None:
    """A copy of `shard` with an image member of `size` bytes (and its caption) among its samples, halfway: a sparse
    file, whose member takes no disk, though a reader receives all of its bytes."""
    with tarfile.open(shard) as source:
        members = [(member.name, source.extractfile(member).read()) for member in source.getmembers()]
    half = len(members) // 2
    members = [*members[:half], ("huge.png", size), ("huge.txt", b"a huge image"), *members[half:]]
    with open(path, "wb") as out:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = data if isinstance(data, int) else len(data)
            out.write(info.tobuf())
            padded = -(-info.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
            if isinstance(data, int):
                out.seek(padded, os.SEEK_CUR)
            else:
                out.write(data.ljust(padded, b"\0"))
        out.write(b"\0" * 2 * tarfile.BLOCKSIZE)  # the end-of-archive blocks


def write_hostile_shards(directory):
    """Shards with one sample of every kind of damage; returns (urls, good keys, expected skips)."""
    directory.mkdir()
    damaged = [
        {**good(100), "png": b"these bytes are not an image"},
        {**good(101), "txt": b"   "},
        {**good(102), "txt": b"caption \xff\xfe"},
        {key: value for key, value in good(103).items() if key != "txt"},
        {key: value for key, value in good(104).items() if key != "png"},
        {**good(105), "json": b"{not json"},
        {**good(106), "png": png(size=40)},  # 1600 pixels, over the test's max_image_pixels
    ]
    write_tar(
        directory / "a.tar",
        [good(0), good(1), *damaged[:4], good(2), {**good(1), "txt": b"again"}, *damaged[4:], good(3)],
    )
    write_tar(directory / "full.tar", [good(10), good(11), good(12)])
    data = (directory / "full.tar").read_bytes()
    with tarfile.open(directory / "full.tar") as tar:
        last_png = next(m for m in tar.getmembers() if m.name == "000000012.png")
    (directory / "b.tar").write_bytes(data[: last_png.offset_data + last_png.size // 2])  # truncated mid-image
    (directory / "full.tar").unlink()
    (directory / "c.tar").mkdir()  # exists, but cannot be read as a file
    urls = "::".join(str(directory / name) for name in ("a.tar", "b.tar", "c.tar"))
    expected = {
        "bad_image": 1,
        "empty_caption": 1,
        "non_utf8_caption": 1,
        "missing_caption": 1,
        "missing_image": 2,
        "bad_json": 1,
        "huge_image": 1,
        "duplicate_key": 1,
        "bad_tar": 1,
        "unreadable_shard": 1,
    }  # missing_image 2: sample 104 and the truncated sample 12
    return urls, [0, 1, 2, 3, 10, 11], expected

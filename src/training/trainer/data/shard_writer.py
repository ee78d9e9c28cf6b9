"""Writing webdataset shards the way the loader reads them: byte-identical tars for identical samples.

The generated data sets (`training.synthetic_scenes`, the laboratory's `studies.glyphs` and `studies.icons`) write their
splits and clone-selection sets with `write_shards`; `sizes.json` (read by get_dataset_size) and clip-benchmark's
`nshards.txt` are written beside the tars on request. `write_classification_set` and `write_retrieval_set` write a
clip-benchmark `wds/` set (`test/<n>.tar`, `nshards.txt` and the files its task reads).
"""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import Iterable, Sequence, Tuple

import webdataset as wds
from PIL import Image


def write_shards(
    directory: Path,
    samples: Iterable[dict],
    shard_size: int,
    name_format: str,
    *,
    with_sizes: bool = False,
    with_nshards: bool = False,
) -> str:
    """Write samples into tars of `shard_size` samples; return the brace pattern relative to the parent folder.

    Tar members get a fixed integer mtime, owner and mode, so the same samples give byte-identical
    tars with plain ustar headers (a float mtime would add a pax header to every member).
    """
    directory.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}
    samples = iter(samples)
    while chunk := list(itertools.islice(samples, shard_size)):
        name = name_format.format(len(sizes))
        with wds.TarWriter(str(directory / name), encoder=False, mtime=0, user="demo", group="demo") as sink:
            for sample in chunk:
                sink.write(sample)
        sizes[name] = len(chunk)
    if with_sizes:
        (directory / "sizes.json").write_text(json.dumps(sizes, indent=1, sort_keys=True) + "\n")
    if with_nshards:
        (directory / "nshards.txt").write_text(f"{len(sizes)}\n")
    return f"{directory.name}/{brace_pattern(name_format, len(sizes))}"


def brace_pattern(name_format: str, count: int) -> str:
    """'shard-{:06d}.tar', 3 -> 'shard-{000000..000002}.tar' (a plain name for one shard)."""
    if count == 1:
        return name_format.format(0)
    prefix, rest = name_format.split("{", 1)
    spec, suffix = rest.split("}", 1)
    number = "{" + spec + "}"
    return f"{prefix}{{{number.format(0)}..{number.format(count - 1)}}}{suffix}"


def encode_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def json_bytes(obj: dict) -> bytes:
    """A json member with sorted keys (byte-identical for equal objects)."""
    return json.dumps(obj, sort_keys=True).encode()


def write_classification_set(
    root: Path,
    samples: Iterable[Tuple[Image.Image, int]],
    classes: Sequence[str],
    templates: Sequence[str],
    shard_size: int,
) -> Path:
    """A clip-benchmark `wds/` zero-shot classification set in `root`: (image, class index) samples as
    test/<n>.tar of <key>.png + <key>.cls, `classnames.txt` and `zeroshot_classification_templates.txt`
    (each template with a `{c}`); returns `root`."""
    write_shards(
        root / "test",
        (
            {"__key__": f"{index:06d}", "png": encode_png(image), "cls": str(label).encode()}
            for index, (image, label) in enumerate(samples)
        ),
        shard_size,
        "{}.tar",
        with_nshards=True,
    )
    (root / "classnames.txt").write_text("\n".join(classes) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("\n".join(templates) + "\n")
    return root


def write_retrieval_set(root: Path, samples: Iterable[Tuple[Image.Image, str]], shard_size: int) -> Path:
    """A clip-benchmark `wds/` retrieval set in `root`: (image, caption) samples as test/<n>.tar of <key>.png +
    <key>.txt, and `dataset_type.txt`; returns `root`."""
    write_shards(
        root / "test",
        (
            {"__key__": f"{index:06d}", "png": encode_png(image), "txt": caption.encode()}
            for index, (image, caption) in enumerate(samples)
        ),
        shard_size,
        "{}.tar",
        with_nshards=True,
    )
    (root / "dataset_type.txt").write_text("retrieval\n")
    return root

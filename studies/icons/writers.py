"""The icon data set on disk: training shards in families of named variants, held-out icons for evaluation.

`write_icon_dataset(output_dir)` splits the catalogue's icons (every icon of a kept family, `catalogue`) by a
hash of (name, seed) into train (80%), val (10%) and test (10%): a val or test icon's image and caption never
occur in training, though its family's other icons mostly do. Then:

    manifest.json                 counts, patterns, settings, the variant words, distinct training icons
    ORIGIN.md, LICENSE_*          where the artwork comes from and its licences
    train/shard-000000.tar ...    families of `family_size` training icons, consecutive: a random training icon
                                  and `family_size - 1` other training icons of its family;
                                  <key>.png, <key>.txt (the name's words), <key>.json {"key", "caption", "name",
                                  "codepoint", "family": id of the drawn family, "family_root": the root's name,
                                  "variant": the words after the root (null for the root),
                                  "clone_groups": [the root's group id] (the same for every drawing of a family)};
                                  keys are a seeded permutation of the sample numbers (no family order)
    val/...                       the val icons (validation retrieval, the collapse check)
    benchmark/icon_retrieval/     clip-benchmark `wds/` retrieval on the test icons
    benchmark/icon_families/      clip-benchmark `wds/` zero-shot classification of the test icons' family roots
    clone_selection/              the test icons: <key>.png + <key>.json {"key", "caption", "clones": {kind: a
                                  sibling's caption}, "family": up to `family_size - 1` siblings' captions,
                                  "family_kinds": each sibling's kind}

A sibling's kind is `mark` when its image differs from the test icon's in at most `FINE_SHARE` of the pixels
(the evaluator's name for the siblings that differ by a few pixels, as a glyph's diacritic does), else `variant`;
`clone/family_without_mark` is then family accuracy without those near-identical siblings.
Same arguments -> byte-identical files.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import json
import shutil
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Sequence

import numpy as np

from training.trainer.data.shard_writer import (
    encode_png,
    json_bytes,
    write_classification_set,
    write_retrieval_set,
    write_shards,
)

from .catalogue import (
    CHARMAP_FILE,
    DISTRIBUTION,
    FONT_FILE,
    LICENCE_FILE,
    MIN_BASES,
    MIN_VARIANTS,
    Catalogue,
    Icon,
    distribution_file,
    mdi_catalogue,
)
from .rendering import render_icon

SPLITS = ("train", "val", "test")
_STREAMS = {"train": 0, "test": 2, "keys": 3}  # independent random streams (first word of each seed)
RETRIEVAL_SET = "icon_retrieval"
FAMILIES_SET = "icon_families"  # zero-shot classification of the test icons' family roots
FAMILIES_TEMPLATES = ("an icon of {c}.",)
CLONE_GROUPS = "clone_groups"
MARK_KIND, VARIANT_KIND = "mark", "variant"
# The glyph benchmark's diacritic-mark siblings differ from their glyph in at most 30 of 1024 pixels at 32 px
# (their 90th percentile, 12 the median; 400 random glyphs, ink below 128): a sibling within that share of its
# icon's pixels is as near-identical as a mark sibling.
FINE_SHARE = 30 / 1024
APACHE_LICENCE = Path(__file__).with_name("LICENSE_APACHE-2.0")  # the font's licence; the wheel ships no copy
LAYOUT_VERSION = 1


def split_of(icon: Icon, seed: int) -> str:
    """train (80%), val (10%) or test (10%), by a hash of the icon's name and the seed."""
    bucket = int.from_bytes(hashlib.sha256(f"{seed}:{icon.name}".encode()).digest()[:4], "big") % 10
    return "val" if bucket == 0 else "test" if bucket == 1 else "train"


def group_id(root: str) -> int:
    """A family's group id (`clone_groups`): a hash of its root's name, a non-negative int64."""
    return int.from_bytes(hashlib.blake2b(root.encode(), digest_size=8).digest(), "big") >> 1


def ink(image) -> np.ndarray:
    """The dark pixels of a rendered icon."""
    return np.asarray(image.convert("L")) < 128


def sibling_kind(icon_ink: np.ndarray, sibling_ink: np.ndarray) -> str:
    """`mark` when the two images differ in at most FINE_SHARE of their pixels, else `variant`."""
    return MARK_KIND if (icon_ink != sibling_ink).mean() <= FINE_SHARE else VARIANT_KIND


def draw_family(
    rng: np.random.Generator, eligible: Sequence[Icon], members: Mapping[str, Sequence[Icon]], family_size: int
) -> List[Icon]:
    """A random eligible icon and `family_size - 1` other icons of its family (`members`: an icon's name -> the
    split's icons of its family), in random order after it."""
    first = eligible[rng.integers(len(eligible))]
    others = [icon for icon in members[first.name] if icon != first]
    chosen = rng.choice(len(others), size=family_size - 1, replace=False)
    return [first, *(others[position] for position in chosen)]


def write_icon_dataset(
    output_dir: str | Path,
    *,
    seed: int = 0,
    num_train: int = 6144,
    image_size: int = 32,
    family_size: int = 4,
    shard_size: int = 512,
    catalogue: Catalogue | None = None,
) -> dict:
    """Write the layout of the module docstring into `output_dir` (see there); returns its manifest (paths in it
    are relative to `output_dir`)."""
    if family_size < 2 or num_train < family_size or shard_size % family_size:
        raise ValueError(
            f"need family_size >= 2, num_train >= family_size and shard_size a multiple of "
            f"family_size (got {family_size}, {num_train}, {shard_size})"
        )
    catalogue = catalogue or mdi_catalogue()
    root = Path(output_dir)
    by_split: Dict[str, List[Icon]] = {split: [] for split in SPLITS}
    for icon in catalogue.icons:
        by_split[split_of(icon, seed)].append(icon)
    train_members: Dict[str, List[Icon]] = {}
    for icon in by_split["train"]:
        train_members.setdefault(catalogue.root[icon.name], []).append(icon)
    by_name = {icon.name: train_members[catalogue.root[icon.name]] for icon in by_split["train"]}
    eligible = [icon for icon in by_split["train"] if len(by_name[icon.name]) >= family_size]
    if not eligible:
        raise ValueError(f"no family holds {family_size} training icons: pass a smaller family_size")

    drawn = (
        (family, icon)
        for family in itertools.count()
        for icon in draw_family(
            np.random.default_rng([seed, _STREAMS["train"], family]), eligible, by_name, family_size
        )
    )
    train = list(itertools.islice(drawn, num_train))
    keys = np.random.default_rng([seed, _STREAMS["keys"]]).permutation(num_train)
    train_pattern = write_shards(
        root / "train",
        (
            _icon_sample(
                f"{key:09d}",
                icon,
                image_size,
                txt=True,
                family=family,
                family_root=catalogue.root[icon.name],
                variant=catalogue.variant_of(icon),
                **{CLONE_GROUPS: [group_id(catalogue.root[icon.name])]},
            )
            for key, (family, icon) in zip(keys.tolist(), train)
        ),
        shard_size,
        "shard-{:06d}.tar",
        with_sizes=True,
    )
    first_val = num_train
    val = by_split["val"]
    val_pattern = write_shards(
        root / "val",
        (_icon_sample(f"{first_val + offset:09d}", icon, image_size, txt=True) for offset, icon in enumerate(val)),
        shard_size,
        "shard-{:06d}.tar",
        with_sizes=True,
    )
    first_test = first_val + len(val)
    test = by_split["test"]
    retrieval = write_retrieval_set(
        root / "benchmark" / RETRIEVAL_SET, ((render_icon(icon, image_size), icon.caption) for icon in test), shard_size
    )
    families_set = _write_families_set(root / "benchmark" / FAMILIES_SET, test, catalogue, image_size, shard_size)
    kinds: Dict[str, int] = {MARK_KIND: 0, VARIANT_KIND: 0}
    write_shards(
        root / "clone_selection",
        _clone_samples(test, catalogue, seed, first_test, image_size, family_size, kinds),
        shard_size,
        "shard-{:06d}.tar",
    )
    shutil.copyfile(APACHE_LICENCE, root / "LICENSE_MDI")
    shutil.copyfile(distribution_file(LICENCE_FILE), root / "LICENSE_QTAWESOME")
    (root / "ORIGIN.md").write_text(ORIGIN)
    families = catalogue.families()
    manifest = {
        "layout_version": LAYOUT_VERSION,
        "seed": seed,
        "image_size": image_size,
        "family_size": family_size,
        "source": {
            "distribution": f"{DISTRIBUTION}=={importlib.metadata.version(DISTRIBUTION)}",
            "font": FONT_FILE,
            "charmap": CHARMAP_FILE,
        },
        "charmap_icons": catalogue.charmap_size,
        "family_rule": {"min_bases": MIN_BASES, "min_variants": MIN_VARIANTS, "variant_words": sorted(catalogue.words)},
        "families": len(families),
        "icons": {split: len(items) for split, items in by_split.items()},
        "variants_per_family": _spread([len(members) - 1 for members in families.values()]),
        "identical_images": _identical_images(catalogue.icons, image_size),
        "splits": {
            "train": {"data": train_pattern, "num_samples": num_train, "keys": [0, num_train]},
            "val": {"data": val_pattern, "num_samples": len(val), "keys": [first_val, first_test]},
            "test": {"num_samples": len(test), "keys": [first_test, first_test + len(test)]},
        },
        "benchmark": {
            RETRIEVAL_SET: str(retrieval.relative_to(root)),
            FAMILIES_SET: str(families_set.relative_to(root)),
        },
        "clone_selection": "clone_selection",
        "clone_selection_sibling_kinds": kinds,
        "train_families": len({catalogue.root[icon.name] for _, icon in train}),
        "train_distinct_icons": len({icon for _, icon in train}),
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _spread(values: Sequence[int]) -> Dict[str, float]:
    return {"min": min(values), "median": float(np.median(values)), "mean": float(np.mean(values)), "max": max(values)}


def _identical_images(icons: Sequence[Icon], image_size: int) -> int:
    """How many icons render to the same pixels as another icon of the data set."""
    counts: Dict[bytes, int] = {}
    for icon in icons:
        pixels = render_icon(icon, image_size).tobytes()
        counts[pixels] = counts.get(pixels, 0) + 1
    return sum(count for count in counts.values() if count > 1)


def _icon_sample(key: str, icon: Icon, image_size: int, txt: bool = False, **meta) -> dict:
    """One sample: the icon's png, its caption as txt (when `txt`), and its json (key, caption, name, code point,
    `meta`)."""
    info = {"key": key, "caption": icon.caption, "name": icon.name, "codepoint": icon.codepoint, **meta}
    members = {"txt": icon.caption.encode()} if txt else {}
    return {"__key__": key, "png": encode_png(render_icon(icon, image_size)), **members, "json": json_bytes(info)}


def _write_families_set(
    root: Path, test: Sequence[Icon], catalogue: Catalogue, image_size: int, shard_size: int
) -> Path:
    """clip-benchmark wds classification of each test icon by its family root's words, among the test icons'."""
    root_caption = {icon.name: catalogue.root[icon.name].replace("-", " ") for icon in test}
    classes = sorted(set(root_caption.values()))
    label = {name: position for position, name in enumerate(classes)}
    samples = ((render_icon(icon, image_size), label[root_caption[icon.name]]) for icon in test)
    return write_classification_set(root, samples, classes, FAMILIES_TEMPLATES, shard_size)


def _clone_samples(
    test: Sequence[Icon],
    catalogue: Catalogue,
    seed: int,
    first_key: int,
    image_size: int,
    family_size: int,
    kinds: Dict[str, int],
) -> Iterator[dict]:
    """Each test icon with up to `family_size - 1` siblings of its family (every split's), their kinds, and one
    sibling caption per kind (`clones`); counts the kinds into `kinds`."""
    families = catalogue.families()
    for offset, icon in enumerate(test):
        others = [other for other in families[catalogue.root[icon.name]] if other != icon]
        rng = np.random.default_rng([seed, _STREAMS["test"], offset])
        chosen = [others[position] for position in rng.permutation(len(others))[: family_size - 1]]
        icon_ink = ink(render_icon(icon, image_size))
        family_kinds = [sibling_kind(icon_ink, ink(render_icon(other, image_size))) for other in chosen]
        clones: Dict[str, str] = {}
        for kind, other in zip(family_kinds, chosen):
            clones.setdefault(kind, other.caption)
            kinds[kind] += 1
        yield _icon_sample(
            f"{first_key + offset:09d}",
            icon,
            image_size,
            clones=clones,
            family=[other.caption for other in chosen],
            family_kinds=family_kinds,
        )


ORIGIN = f"""# Origin and licence of the icon data set's images

Every image is one icon of the Material Design Icons font, version 6.9.96 (Pictogrammers,
https://pictogrammers.com/library/mdi/), as PyPI's QtAwesome 1.4.2 wheel ships it
(`{FONT_FILE}`), rasterised by FreeType through Pillow. Each caption is the icon's name in the wheel's charmap
(`{CHARMAP_FILE}`) with its hyphens as spaces: the font authors' names, not a template of ours.

The wheel's METADATA states that the Material Design Icons font is licensed under the Apache License,
Version 2.0; the wheel ships no copy of that licence, so LICENSE_MDI beside this file is the licence's
standard text. The wheel's own licence (QtAwesome, (c) 2015 The Spyder development team, MIT; it covers the
charmap as packaged) is LICENSE_QTAWESOME, copied from the wheel. Written by `python -m studies.icons`
(open_clip_adacl).
"""

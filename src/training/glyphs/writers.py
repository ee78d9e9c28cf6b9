"""The glyph benchmark on disk: training shards in families of siblings, held-out glyphs for evaluation.

`write_glyph_dataset(output_dir)` splits the catalogue's glyphs (every covered letter in every face) by a
hash of (letter, face, seed) into train (80%), val (10%) and test (10%): a val or test glyph's image and
exact caption never occur in training, though its letter occurs in other faces and its face with other
letters. Then:

    manifest.json                 counts, patterns, settings, distinct training glyphs, weak-caption duplicates
    ORIGIN.md, LICENSE_DEJAVU     where the artwork comes from and its licence (the fonts' own)
    train/shard-000000.tar ...    families of `family_size` training glyphs, consecutive: a base glyph and
                                  siblings that each differ from it in one attribute kind (`catalogue`);
                                  <key>.png, <key>.txt (gold caption), <key>.txt_weak (the generic captioner's),
                                  <key>.json {"key", "caption", "caption_weak", "family": id,
                                  "family_edit": the sibling's kind (null for the base), "codepoint", "face"}
    val/...                       the val glyphs, gold captions (validation retrieval, the collapse check)
    benchmark/glyph_retrieval/    clip-benchmark `wds/` retrieval on the test glyphs (one gold caption each)
    clone_selection/              the test glyphs: <key>.png + <key>.json {"key", "caption",
                                  "clones": {kind: a sibling's caption}, "family": [every sibling's caption],
                                  "family_kinds": [each sibling's kind]}

The weak captioner keeps the letter (`latin small letter e`) and drops each detail group (the marks, the
weight word, the slant word, the typeface word) with probability `weak_drop`, per sample: the method's
weakly supervised setting, where siblings often share one caption. Evaluation always uses gold captions.
Same arguments -> byte-identical files.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from training.trainer.data.shard_writer import encode_png, json_bytes, write_shards

from .catalogue import ATTRIBUTE_KINDS, FACES, Glyph, SiblingIndex, all_glyphs, font_dir
from .rendering import render_glyph

SPLITS = ("train", "val", "test")
_STREAMS = {"train": 0, "weak": 1, "test": 2}  # independent random streams (first word of each rng's seed)
RETRIEVAL_SET = "glyph_retrieval"


@dataclass(frozen=True)
class GlyphDataset:
    """Where `write_glyph_dataset` put things; shard patterns are ready for --train-data/--val-data."""

    root: Path
    train_data: str
    val_data: str
    num_samples: Dict[str, int]
    retrieval: Path
    clone_selection: Path


def split_of(glyph: Glyph, seed: int) -> str:
    """train (80%), val (10%) or test (10%), by a hash of the glyph and the seed (stable across versions)."""
    digest = hashlib.sha256(f"{seed}:{glyph.letter.codepoint}:{glyph.face.words}".encode()).digest()
    bucket = int.from_bytes(digest[:4], "big") % 10
    return "val" if bucket == 0 else "test" if bucket == 1 else "train"


def weak_caption(glyph: Glyph, rng: np.random.Generator, drop: float) -> str:
    """The generic captioner: the letter always, each detail group (marks, weight, slant, typeface) kept with
    probability 1 - `drop`."""
    letter = glyph.letter
    name = f"latin {letter.case} letter {letter.base}"
    if letter.marks and rng.random() >= drop:
        name += f" with {letter.marks}"
    face = [getattr(glyph.face, part) for part in ("weight", "slant", "typeface") if rng.random() >= drop]
    return f"{name}, {' '.join(face)}" if face else name


def family_around(
    base: Glyph, rng: np.random.Generator, siblings: SiblingIndex, family_size: int
) -> List[Tuple[str, Glyph]]:
    """(kind, sibling) for up to `family_size - 1` distinct siblings of `base`: one of each attribute kind it
    has, then more of the most numerous kinds (marks) in random order."""
    by_kind = {kind: list(siblings.siblings(base, kind)) for kind in ATTRIBUTE_KINDS}
    for options in by_kind.values():
        rng.shuffle(options)
    chosen = [(kind, options[0]) for kind, options in by_kind.items() if options]
    rest = [(kind, glyph) for kind, options in by_kind.items() for glyph in options[1:]]
    rng.shuffle(rest)
    return [*chosen, *rest][: family_size - 1]


def sample_family(
    rng: np.random.Generator, bases: Sequence[Glyph], siblings: SiblingIndex, family_size: int
) -> List[Tuple[Optional[str], Glyph]]:
    """(kind, or None for the base; glyph): a random base and `family_size - 1` siblings of it
    (`family_around`); a base with too few siblings is redrawn."""
    while True:
        base = bases[rng.integers(len(bases))]
        members = family_around(base, rng, siblings, family_size)
        if len(members) == family_size - 1:
            return [(None, base), *members]


def write_glyph_dataset(
    output_dir: str | Path,
    *,
    seed: int = 0,
    num_train: int = 6144,
    image_size: int = 32,
    family_size: int = 8,
    shard_size: int = 512,
    weak_drop: float = 0.5,
) -> GlyphDataset:
    """Write the layout of the module docstring into `output_dir` (see there)."""
    if family_size < 2 or num_train < family_size or shard_size % family_size:
        raise ValueError(
            f"need family_size >= 2, num_train >= family_size and shard_size a multiple of "
            f"family_size (got {family_size}, {num_train}, {shard_size})"
        )
    if not 0 <= weak_drop <= 1:
        raise ValueError(f"weak_drop is a probability, got {weak_drop}")
    root = Path(output_dir)
    glyphs = all_glyphs()
    by_split: Dict[str, List[Glyph]] = {split: [] for split in SPLITS}
    for glyph in glyphs:
        by_split[split_of(glyph, seed)].append(glyph)
    train_siblings, all_siblings = SiblingIndex(tuple(by_split["train"])), SiblingIndex(glyphs)

    train = list(_train_samples(seed, by_split["train"], train_siblings, num_train, family_size))
    weak_rng = np.random.default_rng([seed, _STREAMS["weak"]])
    weak = [weak_caption(glyph, weak_rng, weak_drop) for _, _, glyph in train]
    train_pattern = write_shards(
        root / "train", _train_shard_samples(train, weak, image_size), shard_size, "shard-{:06d}.tar", with_sizes=True
    )
    first_val = num_train
    val_pattern = write_shards(
        root / "val",
        _plain_samples(by_split["val"], first_val, image_size),
        shard_size,
        "shard-{:06d}.tar",
        with_sizes=True,
    )
    first_test = first_val + len(by_split["val"])
    test = by_split["test"]
    retrieval = root / "benchmark" / RETRIEVAL_SET
    write_shards(
        retrieval / "test",
        (
            {
                "__key__": f"{index:06d}",
                "png": encode_png(render_glyph(glyph, image_size)),
                "txt": glyph.caption.encode(),
            }
            for index, glyph in enumerate(test)
        ),
        shard_size,
        "{}.tar",
        with_nshards=True,
    )
    (retrieval / "dataset_type.txt").write_text("retrieval\n")
    write_shards(
        root / "clone_selection",
        _clone_samples(test, all_siblings, seed, first_test, image_size, family_size),
        shard_size,
        "shard-{:06d}.tar",
    )
    shutil.copyfile(font_dir() / "LICENSE_DEJAVU", root / "LICENSE_DEJAVU")
    (root / "ORIGIN.md").write_text(ORIGIN)
    manifest = {
        "seed": seed,
        "image_size": image_size,
        "family_size": family_size,
        "weak_drop": weak_drop,
        "faces": [face.file_name for face in FACES],
        "letters": len({glyph.letter for glyph in glyphs}),
        "glyphs": {split: len(items) for split, items in by_split.items()},
        "splits": {
            "train": {"data": train_pattern, "num_samples": num_train, "keys": [0, num_train]},
            "val": {"data": val_pattern, "num_samples": len(by_split["val"]), "keys": [first_val, first_test]},
            "test": {"num_samples": len(test), "keys": [first_test, first_test + len(test)]},
        },
        "benchmark": {RETRIEVAL_SET: str(retrieval.relative_to(root))},
        "clone_selection": "clone_selection",
        "attribute_kinds": list(ATTRIBUTE_KINDS),
        "train_distinct_glyphs": len({glyph for _, _, glyph in train}),
        "train_caption_duplicates": caption_duplicates(train, weak),
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return GlyphDataset(
        root,
        str(root / train_pattern),
        str(root / val_pattern),
        {"train": num_train, "val": len(by_split["val"]), "test": len(test)},
        retrieval,
        root / "clone_selection",
    )


def caption_duplicates(
    train: Sequence[Tuple[int, Optional[str], Glyph]], weak: Sequence[str]
) -> Dict[str, Dict[str, float]]:
    """Per caption field, the share of training samples whose caption another *different* glyph also has
    (in the split, and within the sample's family): what the weak captioner makes identical."""
    result = {}
    for field, captions in (("txt", [glyph.caption for _, _, glyph in train]), ("txt_weak", list(weak))):
        glyphs_of: Dict[str, set] = {}
        family_glyphs: Dict[Tuple[int, str], set] = {}
        for (family, _, glyph), caption in zip(train, captions):
            glyphs_of.setdefault(caption, set()).add(glyph)
            family_glyphs.setdefault((family, caption), set()).add(glyph)
        result[field] = {
            "shared_in_split": sum(len(glyphs_of[c]) > 1 for c in captions) / len(captions),
            "shared_in_family": sum(len(family_glyphs[(f, c)]) > 1 for (f, _, _), c in zip(train, captions))
            / len(captions),
        }
    return result


def _train_samples(
    seed: int, bases: Sequence[Glyph], siblings: SiblingIndex, count: int, family_size: int
) -> Iterator[Tuple[int, Optional[str], Glyph]]:
    """(family id, kind, glyph) of the first `count` training samples, each family from its own rng."""
    samples = (
        (family, kind, glyph)
        for family in itertools.count()
        for kind, glyph in sample_family(
            np.random.default_rng([seed, _STREAMS["train"], family]), bases, siblings, family_size
        )
    )
    return itertools.islice(samples, count)


def _glyph_sample(key: str, glyph: Glyph, image_size: int, members: dict, **meta) -> dict:
    """One sample: the glyph's png, the given members, and its json (key, gold caption, code point, face, `meta`)."""
    face = {"typeface": glyph.face.typeface, "weight": glyph.face.weight, "slant": glyph.face.slant}
    info = {"key": key, "caption": glyph.caption, "codepoint": glyph.letter.codepoint, "face": face, **meta}
    return {"__key__": key, "png": encode_png(render_glyph(glyph, image_size)), **members, "json": json_bytes(info)}


def _train_shard_samples(
    train: Sequence[Tuple[int, Optional[str], Glyph]], weak: Sequence[str], image_size: int
) -> Iterator[dict]:
    for key, ((family, kind, glyph), weak_text) in enumerate(zip(train, weak)):
        yield _glyph_sample(
            f"{key:09d}",
            glyph,
            image_size,
            {"txt": glyph.caption.encode(), "txt_weak": weak_text.encode()},
            caption_weak=weak_text,
            family=family,
            family_edit=kind,
        )


def _plain_samples(glyphs: Sequence[Glyph], first_key: int, image_size: int) -> Iterator[dict]:
    for offset, glyph in enumerate(glyphs):
        yield _glyph_sample(f"{first_key + offset:09d}", glyph, image_size, {"txt": glyph.caption.encode()})


def _clone_samples(
    test: Sequence[Glyph], siblings: SiblingIndex, seed: int, first_key: int, image_size: int, family_size: int
) -> Iterator[dict]:
    """Each test glyph with one sibling caption per kind (`clones`), its family's captions (`family`) and their
    kinds (`family_kinds`): the siblings a training family of the same size would hold around it as base."""
    for offset, glyph in enumerate(test):
        rng = np.random.default_rng([seed, _STREAMS["test"], offset])
        family = family_around(glyph, rng, siblings, family_size)
        clones = {}
        for kind, sibling in family:
            clones.setdefault(kind, sibling.caption)
        yield _glyph_sample(
            f"{first_key + offset:09d}",
            glyph,
            image_size,
            {},
            clones=clones,
            family=[sibling.caption for _, sibling in family],
            family_kinds=[kind for kind, _ in family],
        )


ORIGIN = """# Origin and licence of the glyph benchmark's images

Every image is one glyph of the DejaVu fonts (DejaVu Sans, DejaVu Serif and DejaVu Sans Mono, each in
regular, bold, oblique/italic and bold oblique/italic), as the matplotlib package ships them
(`matplotlib/mpl-data/fonts/ttf`), rasterised by FreeType through Pillow. The glyph designs are
Bitstream Vera's (c) 2003 Bitstream, Inc., with the DejaVu changes in the public domain and glyphs
from the Arev fonts (c) Tavmjong Bah; their licence is LICENSE_DEJAVU beside this file, copied from
the package. The captions are the letters' names from the Unicode Character Database (Python's
`unicodedata`) and the faces' style words. Written by `python -m training.glyphs` (open_clip_adacl).
"""

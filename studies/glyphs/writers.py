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
                                  "family_edit": the sibling's kind (null for the base), "codepoint", "face",
                                  "clone_groups": one-edit group ids, one per attribute kind};
                                  keys are a seeded permutation of the sample numbers (no family order)
    val/...                       the val glyphs, gold captions (validation retrieval, the collapse check)
    benchmark/glyph_retrieval/    clip-benchmark `wds/` retrieval on the test glyphs (one gold caption each)
    benchmark/glyph_letters/      clip-benchmark `wds/` zero-shot classification of the test glyphs' letters
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

from training.trainer.data.shard_writer import (
    encode_png,
    json_bytes,
    write_classification_set,
    write_retrieval_set,
    write_shards,
)

from .catalogue import ATTRIBUTE_KINDS, FACES, Glyph, Letter, SiblingIndex, all_glyphs, font_dir
from .rendering import render_glyph

SPLITS = ("train", "val", "test")
_STREAMS = {"train": 0, "weak": 1, "test": 2, "keys": 3}  # independent random streams (first word of each seed)
RETRIEVAL_SET = "glyph_retrieval"
LETTERS_SET = "glyph_letters"  # zero-shot classification of the test glyphs' letters
LETTERS_TEMPLATES = ("a glyph of {c}.",)
CLONE_GROUPS = "clone_groups"  # the training json's one-edit groups, one id per attribute kind
# The layout's version, in the manifest: 2 added the permuted training keys, the one-edit groups and the letters.
LAYOUT_VERSION = 2


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
    keys = np.random.default_rng([seed, _STREAMS["keys"]]).permutation(num_train)
    train_pattern = write_shards(
        root / "train",
        _train_shard_samples(train, weak, keys, image_size),
        shard_size,
        "shard-{:06d}.tar",
        with_sizes=True,
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
    retrieval = write_retrieval_set(
        root / "benchmark" / RETRIEVAL_SET,
        ((render_glyph(glyph, image_size), glyph.caption) for glyph in test),
        shard_size,
    )
    letters = _write_letters_set(root / "benchmark" / LETTERS_SET, test, image_size, shard_size)
    write_shards(
        root / "clone_selection",
        _clone_samples(test, all_siblings, seed, first_test, image_size, family_size),
        shard_size,
        "shard-{:06d}.tar",
    )
    shutil.copyfile(font_dir() / "LICENSE_DEJAVU", root / "LICENSE_DEJAVU")
    (root / "ORIGIN.md").write_text(ORIGIN)
    manifest = {
        "layout_version": LAYOUT_VERSION,
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
        "benchmark": {RETRIEVAL_SET: str(retrieval.relative_to(root)), LETTERS_SET: str(letters.relative_to(root))},
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
    train: Sequence[Tuple[int, Optional[str], Glyph]], weak: Sequence[str], keys: np.ndarray, image_size: int
) -> Iterator[dict]:
    """The training samples in family order, each under its key of the seeded permutation `keys`, so that a
    sample's key (the trainer's sample id) says nothing of its family."""
    for key, ((family, kind, glyph), weak_text) in zip(keys.tolist(), zip(train, weak)):
        yield _glyph_sample(
            f"{key:09d}",
            glyph,
            image_size,
            {"txt": glyph.caption.encode(), "txt_weak": weak_text.encode()},
            caption_weak=weak_text,
            family=family,
            family_edit=kind,
            **{CLONE_GROUPS: clone_groups(glyph)},
        )


def clone_groups(glyph: Glyph) -> List[int]:
    """One group id per attribute kind (`ATTRIBUTE_KINDS`): the k-th names the glyph with its k-th attribute left
    out, so two glyphs share it exactly when they differ in that attribute alone (or not at all): one-edit
    siblings of kind k, across families too (the oracle's `family_field=clone_groups`)."""
    letter, face = glyph.letter, glyph.face
    attributes = {
        "mark": letter.marks,
        "case": letter.case,
        "weight": face.weight,
        "slant": face.slant,
        "typeface": face.typeface,
    }
    groups = []
    for kind in ATTRIBUTE_KINDS:
        rest = tuple((name, value) for name, value in attributes.items() if name != kind)
        digest = hashlib.blake2b(repr((kind, letter.base, rest)).encode(), digest_size=8).digest()
        groups.append(int.from_bytes(digest, "big") >> 1)
    return groups


def letter_class(letter: Letter) -> str:
    """A letter's class name for zero-shot classification: its name without the face words (the caption's
    first part)."""
    return letter.name


def _write_letters_set(root: Path, test: Sequence[Glyph], image_size: int, shard_size: int) -> Path:
    """clip-benchmark wds classification of each test glyph's letter, among the letters of the test glyphs."""
    classes = sorted({letter_class(glyph.letter) for glyph in test})
    index = {name: label for label, name in enumerate(classes)}
    samples = ((render_glyph(glyph, image_size), index[letter_class(glyph.letter)]) for glyph in test)
    return write_classification_set(root, samples, classes, LETTERS_TEMPLATES, shard_size)


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
`unicodedata`) and the faces' style words. Written by `python -m studies.glyphs` (open_clip_adacl).
"""

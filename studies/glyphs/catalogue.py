"""What the glyph benchmark is made of: packaged fonts' glyphs of accented Latin letters, named by Unicode.

The artwork is the DejaVu fonts' (Sans, Serif, Sans Mono, each in four styles) as matplotlib ships them:
real glyph designs that no one here drew. Each image is one letter in one face; its caption is the
letter's Unicode name (Python's `unicodedata`, lowercased) and the face's three attribute words:

    latin small letter e with circumflex and acute, bold italic serif

A letter is parsed from its name: `LATIN <case> LETTER <base> [WITH <marks>]` with a one-letter base
(so ligatures, dotless i and the like are left out); only letters every one of the twelve faces
covers are kept. The faces' slanted styles are named Oblique in DejaVu Sans and Sans Mono and Italic in
Serif; the captions call both `italic`, so that two faces differ by exactly one word per attribute.

Siblings (clones) of a glyph differ from it in exactly one attribute kind (docs/glyphs.md):
`mark` (same base letter and case, same face, other marks), `case`, `weight`, `slant`, `typeface`.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

TYPEFACES = ("sans", "serif", "mono")
WEIGHTS = ("regular", "bold")
SLANTS = ("upright", "italic")
ATTRIBUTE_KINDS = ("mark", "case", "weight", "slant", "typeface")

# matplotlib's file names of the DejaVu faces: (typeface, weight, slant) -> file.
_FACE_FILES = {
    ("sans", "regular", "upright"): "DejaVuSans.ttf",
    ("sans", "bold", "upright"): "DejaVuSans-Bold.ttf",
    ("sans", "regular", "italic"): "DejaVuSans-Oblique.ttf",
    ("sans", "bold", "italic"): "DejaVuSans-BoldOblique.ttf",
    ("serif", "regular", "upright"): "DejaVuSerif.ttf",
    ("serif", "bold", "upright"): "DejaVuSerif-Bold.ttf",
    ("serif", "regular", "italic"): "DejaVuSerif-Italic.ttf",
    ("serif", "bold", "italic"): "DejaVuSerif-BoldItalic.ttf",
    ("mono", "regular", "upright"): "DejaVuSansMono.ttf",
    ("mono", "bold", "upright"): "DejaVuSansMono-Bold.ttf",
    ("mono", "regular", "italic"): "DejaVuSansMono-Oblique.ttf",
    ("mono", "bold", "italic"): "DejaVuSansMono-BoldOblique.ttf",
}
_LETTER_NAME = re.compile(r"^LATIN (SMALL|CAPITAL) LETTER ([A-Z])(?: WITH (.+))?$")


@dataclass(frozen=True, order=True)
class Face:
    typeface: str
    weight: str
    slant: str

    @property
    def words(self) -> str:
        return f"{self.weight} {self.slant} {self.typeface}"

    @property
    def file_name(self) -> str:
        return _FACE_FILES[(self.typeface, self.weight, self.slant)]


FACES = tuple(Face(*key) for key in sorted(_FACE_FILES))


@dataclass(frozen=True, order=True)
class Letter:
    codepoint: int
    case: str  # "small" or "capital"
    base: str  # "e"
    marks: str  # "circumflex and acute"; "" for the plain letter

    @property
    def name(self) -> str:
        """The Unicode name, lowercased: 'latin small letter e with circumflex and acute'."""
        return unicodedata.name(chr(self.codepoint)).lower()

    @property
    def character(self) -> str:
        return chr(self.codepoint)


@dataclass(frozen=True, order=True)
class Glyph:
    letter: Letter
    face: Face

    @property
    def caption(self) -> str:
        return f"{self.letter.name}, {self.face.words}"


def font_dir() -> Path:
    """The folder of matplotlib's packaged fonts (the DejaVu and STIX families, with their licences)."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def parse_letter(codepoint: int) -> Letter | None:
    """The letter a code point names, or None when its name is not `LATIN <case> LETTER <X> [WITH ...]`."""
    match = _LETTER_NAME.match(unicodedata.name(chr(codepoint), ""))
    if match is None:
        return None
    case, base, marks = match.groups()
    return Letter(codepoint, case.lower(), base.lower(), (marks or "").lower())


@functools.lru_cache(maxsize=1)
def covered_letters() -> Tuple[Letter, ...]:
    """Every parsed Latin letter of the Basic Multilingual Plane that all twelve faces draw, by code point."""
    from fontTools.ttLib import TTFont

    covered = None
    for face in FACES:
        cmap = set(TTFont(font_dir() / face.file_name, lazy=True).getBestCmap())
        covered = cmap if covered is None else covered & cmap
    letters = (parse_letter(codepoint) for codepoint in sorted(covered) if codepoint < 0x10000)
    return tuple(letter for letter in letters if letter is not None)


def all_glyphs() -> Tuple[Glyph, ...]:
    return tuple(Glyph(letter, face) for letter in covered_letters() for face in FACES)


class SiblingIndex:
    """Each glyph's siblings by attribute kind: the glyphs that differ from it in exactly that attribute."""

    def __init__(self, glyphs: Tuple[Glyph, ...]):
        present = set(glyphs)
        by_letter_key: Dict[Tuple[str, str], List[Letter]] = {}
        by_marks_key: Dict[Tuple[str, str], List[Letter]] = {}
        for letter in sorted({glyph.letter for glyph in glyphs}):
            by_letter_key.setdefault((letter.case, letter.base), []).append(letter)
            by_marks_key.setdefault((letter.base, letter.marks), []).append(letter)
        self._present = present
        self._same_base = by_letter_key
        self._same_marks = by_marks_key

    def siblings(self, glyph: Glyph, kind: str) -> List[Glyph]:
        """The present glyphs differing from `glyph` in attribute `kind` only, in a fixed order."""
        letter, face = glyph.letter, glyph.face
        if kind == "mark":
            candidates = [
                Glyph(other, face)
                for other in self._same_base[(letter.case, letter.base)]
                if other.marks != letter.marks
            ]
        elif kind == "case":
            candidates = [
                Glyph(other, face)
                for other in self._same_marks[(letter.base, letter.marks)]
                if other.case != letter.case
            ]
        elif kind in ("weight", "slant", "typeface"):
            values = {"weight": WEIGHTS, "slant": SLANTS, "typeface": TYPEFACES}[kind]
            candidates = [
                Glyph(letter, Face(**{**face.__dict__, kind: value}))
                for value in values
                if value != getattr(face, kind)
            ]
        else:
            raise ValueError(f"unknown attribute kind {kind!r}; the kinds are {', '.join(ATTRIBUTE_KINDS)}")
        return [candidate for candidate in candidates if candidate in self._present]
